package executor

import (
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	setupTestProcess()
	// The reaper loop lives as long as the process by design.
	goleak.VerifyTestMain(m, goleak.IgnoreAnyFunction("github.com/bashtask/bashtask-operator/executor.(*reaper).loop"))
}
