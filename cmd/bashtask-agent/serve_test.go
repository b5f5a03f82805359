package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/bashtask/bashtask-operator/executor"
)

func TestServeRejectsShimPoolSizeOutOfRange(t *testing.T) {
	for _, v := range []string{"-1", "65"} {
		_, err := execute(t, "serve", "--state-dir", t.TempDir(), "--shim-pool-size="+v)
		if err == nil || !strings.Contains(err.Error(), "--shim-pool-size "+v+": want 0 (none) to 64") {
			t.Errorf("serve --shim-pool-size=%s: %v, want the flag's range in the error", v, err)
		}
	}
}

func TestServeRejectsUnusableShimPath(t *testing.T) {
	dir := t.TempDir()
	notExec := filepath.Join(dir, "shim")
	if err := os.WriteFile(notExec, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	for path, want := range map[string]string{
		"bashtask-shim":               `--shim-path "bashtask-shim": want an absolute path`,
		filepath.Join(dir, "missing"): "no such file",
		dir:                           "not a regular file",
		notExec:                       "not executable",
	} {
		_, err := execute(t, "serve", "--state-dir", t.TempDir(), "--shim-path="+path)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("serve --shim-path=%s: %v, want %q in the error", path, err, want)
		}
	}
}

// Without --shim-path the agent starts bashtask-shim from beside its own
// binary when there is one, refuses to start when that one is not
// executable, and starts itself when there is none.
func TestShimPathDefault(t *testing.T) {
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	beside := filepath.Join(filepath.Dir(self), shimBinary)
	got, err := resolveShimPath("")
	if err != nil || got != executor.DefaultShimPath {
		t.Fatalf("without a shim beside the test binary: %q, %v; want %s", got, err, executor.DefaultShimPath)
	}
	if err := os.WriteFile(beside, []byte("#!/bin/true\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Remove(beside) })
	if got, err = resolveShimPath(""); err == nil || !strings.Contains(err.Error(), beside+" beside the agent: not executable") {
		t.Errorf("with a shim beside the test binary that is not executable: %q, %v; want an error naming it", got, err)
	}
	if err := os.Chmod(beside, 0o755); err != nil {
		t.Fatal(err)
	}
	if got, err = resolveShimPath(""); err != nil || got != beside {
		t.Errorf("with a shim beside the test binary: %q, %v; want %s", got, err, beside)
	}
}

func TestServeRejectsBadDiskFlags(t *testing.T) {
	for _, tc := range []struct{ args, want []string }{
		{[]string{"--task-disk-size=ten"}, []string{`--task-disk-size "ten": want a quantity such as 10Gi`}},
		{[]string{"--task-disk-cap=-1Gi"}, []string{`--task-disk-cap "-1Gi": want a whole number of bytes, not negative`}},
		{[]string{"--task-disk-size=20Gi", "--task-disk-cap=10Gi"}, []string{"--task-disk-cap 10Gi is below --task-disk-size 20Gi"}},
	} {
		_, err := execute(t, append([]string{"serve", "--state-dir", t.TempDir()}, tc.args...)...)
		for _, w := range tc.want {
			if err == nil || !strings.Contains(err.Error(), w) {
				t.Errorf("serve %v: %v, want %q in the error", tc.args, err, w)
			}
		}
	}
}

func TestServeRejectsNegativeWorkspaceTimeout(t *testing.T) {
	_, err := execute(t, "serve", "--state-dir", t.TempDir(), "--shutdown-workspace-timeout=-1s")
	if err == nil || !strings.Contains(err.Error(), "--shutdown-workspace-timeout -1s: want 0 (move no workspace) or more") {
		t.Errorf("serve --shutdown-workspace-timeout=-1s: %v, want the flag's range in the error", err)
	}
}

func TestServeRejectsBadRunPaths(t *testing.T) {
	for _, p := range []string{"run/x.sock", "/var/run/docker.sock", "/run/../etc/shadow", "/run"} {
		_, err := execute(t, "serve", "--state-dir", t.TempDir(), "--task-run-paths="+p)
		want := fmt.Sprintf("--task-run-paths: run path %q: want a clean absolute path below /run", p)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("serve --task-run-paths=%s: %v, want %q in the error", p, err, want)
		}
	}
}

func TestServeRejectsUnknownUnenforcedLimits(t *testing.T) {
	_, err := execute(t, "serve", "--state-dir", t.TempDir(), "--unenforced-limits=ignore")
	if err == nil || !strings.Contains(err.Error(), `--unenforced-limits "ignore": want warn or refuse`) {
		t.Errorf("serve --unenforced-limits=ignore: %v, want the flag, the value and the choices in the error", err)
	}
}

func TestServeRejectsBadImageFlags(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--image-cache-size=lots"}, `--image-cache-size "lots": want a quantity such as 10Gi`},
		{[]string{"--registry-mirror=docker.io"}, `--registry-mirror "docker.io": want HOST=MIRROR`},
		{[]string{"--registry-mirror=docker.io=https://mirror.example/v2"}, `--registry-mirror "docker.io=https://mirror.example/v2": want HOST=MIRROR`},
		{[]string{"--image-cache-dir=images"}, `--image-cache-dir "images": want an absolute path`},
		{[]string{"--default-image=debian:12"}, "--default-image debian:12: images need --isolation=tenant"},
	} {
		_, err := execute(t, append([]string{"serve", "--state-dir", t.TempDir()}, tc.args...)...)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("serve %v: %v, want %q in the error", tc.args, err, tc.want)
		}
	}
}
