package executor

import (
	"errors"
	"fmt"
	"os/exec"
	"strings"
	"syscall"
	"testing"
)

// envOfSize returns environment entries that make path and argv measure
// exactly size bytes by argEnvSize.
func envOfSize(t *testing.T, path string, argv []string, size int64) []string {
	t.Helper()
	var env []string
	need := size - argEnvSize(path, argv, nil)
	for need > 0 {
		v := min(need-1-ptrSize-int64(len("E000=")), 120000)
		if v < 0 {
			t.Fatalf("cannot fill %d bytes", need)
		}
		e := fmt.Sprintf("E%03d=", len(env)) + strings.Repeat("x", int(v))
		env = append(env, e)
		need -= int64(len(e) + 1 + ptrSize)
	}
	if got := argEnvSize(path, argv, env); got != size {
		t.Fatalf("built %d bytes, want %d", got, size)
	}
	return env
}

// TestArgEnvLimitIsTheKernels: the running kernel accepts arguments and
// environment of exactly ArgEnvLimit bytes, as argEnvSize counts them, and
// refuses one byte more with E2BIG, so the pre-start check refuses nothing
// the kernel would run.
func TestArgEnvLimitIsTheKernels(t *testing.T) {
	t.Parallel()
	limit := ArgEnvLimit(stackLimit())
	for _, size := range []int64{limit, limit + 1} {
		argv := []string{"/bin/true", "-c", "x"}
		cmd := exec.Command(argv[0], argv[1:]...)
		cmd.Env = envOfSize(t, argv[0], argv, size)
		err := cmd.Start()
		if err == nil {
			_ = cmd.Wait() // the test process's reaper may reap it first
		}
		if e2big := errors.Is(err, syscall.E2BIG); e2big != (size > limit) {
			t.Errorf("execve with %d bytes against a limit of %d: %v", size, limit, err)
		}
	}
}

// TestC43_EnvOverArgMax: entries of 120 KB each, every one under the
// kernel's per-string limit but over ARG_MAX together (32 of them with the
// usual 8 MiB stack), fail at once with the total and the limit.
func TestC43_EnvOverArgMax(t *testing.T) {
	t.Parallel()
	ex := newTestExecutor(t, CgroupOff)
	stack := stackLimit()
	limit := ArgEnvLimit(stack)
	spec := testSpec(t, "true")
	for i := range max(32, int(limit/120000)+2) {
		spec.Env = append(spec.Env, EnvVar{Name: fmt.Sprintf("BIG%02d", i), Value: strings.Repeat("v", 120000)})
	}
	_, err := ex.Start(spec)
	var se *StartError
	if !errors.Is(err, ErrArgumentTooLong) || !errors.As(err, &se) {
		t.Fatalf("Start: %v, want a *StartError with ErrArgumentTooLong", err)
	}
	// The size the message must give: the task's whole environment as
	// BuildEnv makes it, with the command.
	env, berr := BuildEnv(EnvOptions{Mode: AmbientInherit, Ambient: ex.ambient, Explicit: spec.Env, Managed: spec.ManagedEnv})
	if berr != nil {
		t.Fatal(berr)
	}
	size := argEnvSize(ex.shell, []string{ex.shell, "-c", "true"}, env)
	for _, want := range []string{
		fmt.Sprintf("environment and arguments total %d bytes", size),
		fmt.Sprintf("over the kernel's limit of %d bytes (ARG_MAX", limit),
		"the largest entries: BIG00 (120006 bytes)",
	} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("message %q does not contain %q", err, want)
		}
	}
	if res := StartFailedResult(err); res.Reason != ReasonStartFailed || res.Message != err.Error() {
		t.Errorf("StartFailedResult = %+v", res)
	}
}
