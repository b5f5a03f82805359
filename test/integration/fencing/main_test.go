// Package fencing_test runs two bashtask-controller processes with leader
// election against one control plane and in-process agents
// (internal/rig/testrig without its controller), pauses the leader with
// SIGSTOP for longer than its lease, and checks from what the agents saw
// that the paused process, once resumed, makes no call the agents accept.
package fencing_test

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/bashtask/bashtask-operator/internal/rig/localcluster"
	"github.com/bashtask/bashtask-operator/internal/rig/testrig"
)

var (
	rig *testrig.Rig
	// controllerBin is the bashtask-controller binary built by TestMain.
	controllerBin string
	// calls records every Start, Cancel and Watch the agents served.
	calls = &callLog{}
)

func TestMain(m *testing.M) { os.Exit(run(m)) }

func run(m *testing.M) int {
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil || strings.TrimSpace(string(out)) == "" {
		fmt.Fprintln(os.Stderr, "fencing tests: cannot locate the module root:", err)
		return 1
	}
	dir, err := os.MkdirTemp("", "bashtask-fencing-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	controllerBin = filepath.Join(dir, "bashtask-controller")
	build := exec.Command("go", "build", "-o", controllerBin, "./cmd/bashtask-controller")
	build.Dir = filepath.Dir(strings.TrimSpace(string(out)))
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "fencing tests: building bashtask-controller failed:", err)
		return 1
	}
	rig, err = testrig.Start(testrig.Options{
		Agents:        localcluster.LoopbackAgents(2),
		NoController:  true,
		AgentCapacity: 64,
		Unary:         calls.unary,
		Stream:        calls.stream,
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, "starting the test rig:", err)
		return 1
	}
	defer rig.Stop()
	return m.Run()
}
