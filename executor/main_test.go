package executor

import (
	"fmt"
	"os"
	"testing"

	"go.uber.org/goleak"

	"github.com/bashtask/bashtask-operator/executor/shim"
	"github.com/bashtask/bashtask-operator/internal/rig/testshim"
)

func TestMain(m *testing.M) {
	// The test binary is also a task shim of the tenant level (the agent's
	// binary is one too); newTestExecutor's tenant executors start the
	// static bashtask-shim (testshim) unless a test names this one.
	shim.Main()
	// Built before this process becomes a subreaper, whose reaper would
	// take the go command's exit status.
	if err := testshim.Prepare(); err != nil {
		fmt.Fprintln(os.Stderr, "executor tests: bashtask-shim:", err)
		os.Exit(1)
	}
	setupTestProcess()
	// The reaper loop lives as long as the process by design.
	goleak.VerifyTestMain(m, goleak.IgnoreAnyFunction("github.com/bashtask/bashtask-operator/executor.(*reaper).loop"),
		goleak.Cleanup(func(code int) { testshim.Remove(); os.Exit(code) }))
}
