// Package testshim builds the task shim the agent ships, cmd/bashtask-shim,
// for tests and benchmarks that run tasks at the tenant isolation level. It builds it the
// way `make binaries` and the images do (static, CGO_ENABLED=0), so those
// tests run the binary users run rather than the test binary re-executed,
// which links cgo and everything else the tests import.
package testshim

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

// EnvVar names a bashtask-shim already built, for a test binary that runs
// as a task of another (outside the module, with a scrubbed environment):
// the parent passes Path's result in it, and Path returns it as it is.
const EnvVar = "BASHTASK_TEST_SHIM"

// built is the one build of a test process.
var built struct {
	once      sync.Once
	dir, path string
	err       error
}

// Prepare builds bashtask-shim for this test process, from the module
// around the working directory and with the go command on PATH, as `go
// test` runs tests; with EnvVar set it builds nothing. A TestMain whose
// process becomes a subreaper (its reaper reaps every child, the go
// command's too) calls it before that; other test processes may leave the
// build to the first Path.
func Prepare() error {
	if os.Getenv(EnvVar) != "" {
		return nil
	}
	built.once.Do(func() {
		built.dir, built.err = os.MkdirTemp("", "bashtask-test-shim-")
		if built.err == nil {
			built.path, built.err = Build(built.dir)
		}
	})
	return built.err
}

// Path returns bashtask-shim built for this test process (see Prepare,
// which it calls), or EnvVar's path when it is set. A failed build fails t.
func Path(t testing.TB) string {
	t.Helper()
	if p := os.Getenv(EnvVar); p != "" {
		return p
	}
	if err := Prepare(); err != nil {
		t.Fatalf("bashtask-shim for the tests: %v", err)
	}
	return built.path
}

// Remove deletes what Path built; TestMain calls it before the process
// exits.
func Remove() {
	if built.dir != "" {
		os.RemoveAll(built.dir)
	}
}

// Build builds cmd/bashtask-shim of the module around the working
// directory into dir as the images do (static, -trimpath, no symbols) and
// returns the binary's path; the error carries the build's output. It
// needs the go command on PATH.
func Build(dir string) (string, error) {
	gomod, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		return "", fmt.Errorf("finding the module: go env GOMOD: %w", err)
	}
	root := filepath.Dir(strings.TrimSpace(string(gomod)))
	out := filepath.Join(dir, "bashtask-shim")
	cmd := exec.Command("go", "build", "-trimpath", "-ldflags=-s -w", "-o", out, "./cmd/bashtask-shim")
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("building it in %s: %w: %s", root, err, b)
	}
	return out, nil
}

// Built returns the path of the shim Prepare built, or EnvVar's path when
// it is set, for a caller without a testing.TB (a TestMain's rig).
func Built() (string, error) {
	if p := os.Getenv(EnvVar); p != "" {
		return p, nil
	}
	if err := Prepare(); err != nil {
		return "", err
	}
	return built.path, nil
}
