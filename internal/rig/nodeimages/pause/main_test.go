package main

import (
	"bufio"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/bashtask/bashtask-operator/internal/rig/testutil"
)

// asPause makes the test binary run main instead of the tests, so the
// tests start the pause program without building it.
const asPause = "BASHTASK_TEST_RUN_PAUSE"

func TestMain(m *testing.M) {
	if os.Getenv(asPause) == "1" {
		main()
		return
	}
	os.Exit(m.Run())
}

// startPause starts the program: in a new PID namespace with newPIDNS,
// else as an ordinary child, once its signal handlers are set up.
func startPause(t *testing.T, newPIDNS bool) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(os.Args[0])
	cmd.Env = []string{asPause + "=1"}
	if newPIDNS {
		cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWPID}
	}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	if newPIDNS {
		return cmd // PID 1: nothing to wait for, and no signal is sent
	}
	// A signal sent before the handlers are set up would kill it with the
	// default action; it prints its warning once they are.
	line, err := bufio.NewReader(stderr).ReadString('\n')
	if !strings.Contains(line, "not PID 1") {
		t.Fatalf("first line of stderr: %q, %v", line, err)
	}
	return cmd
}

// TestExitsOnSignal checks that SIGTERM and SIGINT end the program with
// status 0, as the runtime expects of a sandbox stopped on purpose.
func TestExitsOnSignal(t *testing.T) {
	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGINT} {
		t.Run(sig.String(), func(t *testing.T) {
			cmd := startPause(t, false)
			if err := cmd.Process.Signal(sig); err != nil {
				t.Fatal(err)
			}
			done := make(chan error, 1)
			go func() { done <- cmd.Wait() }()
			select {
			case err := <-done:
				if err != nil {
					t.Fatalf("exit after %v: %v, want status 0", sig, err)
				}
			case <-time.After(10 * time.Second):
				t.Fatalf("still running 10s after %v", sig)
			}
		})
	}
}

// TestReapsOrphans runs the program as PID 1 of a new PID namespace, as in
// a pod sandbox, enters the namespace with a shell that leaves a short
// background child behind, and checks that the orphan, reparented to the
// program, is reaped when it exits instead of staying a zombie. It needs
// root for the namespace.
func TestReapsOrphans(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("a new PID namespace needs root")
	}
	pause := startPause(t, true)
	pid := strconv.Itoa(pause.Process.Pid)
	nsenter := exec.Command("nsenter", "--target", pid, "--pid", "--", "sh", "-c", "sleep 1 >/dev/null 2>&1 & exit 0")
	if out, err := nsenter.CombinedOutput(); err != nil {
		t.Fatalf("nsenter: %v: %s", err, out)
	}
	// The shell exited at once (the sleep holds none of its output): the
	// sleep is now the program's child for a second.
	testutil.WaitFor(t, "the orphan reparented to pause", 10*time.Second, testutil.Check(func() bool { return len(children(t, pid)) > 0 }, nil))
	testutil.WaitFor(t, "the orphan reaped", 10*time.Second, testutil.Check(func() bool { return len(children(t, pid)) == 0 }, nil))
}

// children lists the children of process pid, zombies included, from
// every thread's children file.
func children(t *testing.T, pid string) []string {
	t.Helper()
	tasks, err := filepath.Glob("/proc/" + pid + "/task/*/children")
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, f := range tasks {
		b, err := os.ReadFile(f)
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			t.Fatal(err)
		}
		out = append(out, strings.Fields(string(b))...)
	}
	return out
}
