package executor

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/bashtask/bashtask-operator/executor/shim"
)

func TestMain(m *testing.M) {
	// The test binary is also the task shim of the tenant level.
	shim.Main()
	setupTestProcess()
	// The reaper loop lives as long as the process by design.
	goleak.VerifyTestMain(m, goleak.IgnoreAnyFunction("github.com/bashtask/bashtask-operator/executor.(*reaper).loop"))
}
