package client

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	bashtaskv1alpha1 "github.com/bashtask/bashtask-operator/api/v1alpha1"
	"github.com/bashtask/bashtask-operator/executor"
	"github.com/bashtask/bashtask-operator/executor/shim"
	"github.com/bashtask/bashtask-operator/internal/tarcopy"
)

// hostileName is a file name that breaks naive quoting in bash and in
// GNU tar's --transform.
const hostileName = `-n it's a "b&d,n\me" $(x) `

// TestCopyCommandsWithGNUTar runs the commands a copy's task runs, with
// this host's bash and GNU tar on a local directory standing for the
// workspace, on names that need quoting: the download's archive
// extracts to the same tree, the upload lands where kubectl cp puts it,
// and a missing path gives cp's message.
func TestCopyCommandsWithGNUTar(t *testing.T) {
	if _, err := exec.LookPath("tar"); err != nil {
		t.Skip("no tar on this host")
	}
	ws := t.TempDir()
	src := filepath.Join(ws, hostileName)
	if err := os.MkdirAll(filepath.Join(src, "empty"), 0o750); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(src, "f"), []byte("data"), 0o640); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("f", filepath.Join(src, "l")); err != nil {
		t.Fatal(err)
	}
	bash := func(command string, stdin []byte) ([]byte, string, error) {
		var out, errOut bytes.Buffer
		cmd := exec.Command("bash", "-c", command)
		cmd.Stdin, cmd.Stdout, cmd.Stderr = bytes.NewReader(stdin), &out, &errOut
		err := cmd.Run()
		return out.Bytes(), errOut.String(), err
	}

	// Download: the archive, tar's status, then the command waits to be
	// cancelled, as CopyFrom reads it.
	// The workspace's own directories inside the copied tree stay out.
	for _, dir := range []string{".bashtask-tmp", ".bashtask-root"} {
		if err := os.MkdirAll(filepath.Join(src, dir, "upper"), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Mkdir(filepath.Join(src, "empty", ".bashtask-tmp"), 0o755); err != nil {
		t.Fatal(err) // the same name deeper is a task's own file
	}
	internal := []string{filepath.Join(src, ".bashtask-tmp"), filepath.Join(src, ".bashtask-root"), "/elsewhere/.bashtask-tmp"}
	download := exec.Command("bash", "-c", archiveCommand("w:x", src, internal))
	stdout, err := download.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var downloadErr bytes.Buffer
	download.Stderr = &downloadErr
	// Its own process group, killed whole: the waiting sleep holds stderr.
	download.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := download.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = syscall.Kill(-download.Process.Pid, syscall.SIGKILL); _ = download.Wait() })
	local := filepath.Join(t.TempDir(), "copy")
	if err := tarcopy.Extract(stdout, hostileName, local, tarcopy.ExtractOptions{}); err != nil {
		t.Fatal(err)
	}
	if code, err := readTarStatus(stdout); err != nil || code != 0 {
		t.Fatalf("tar's status: %d, %v; stderr %s", code, err, downloadErr.String())
	}
	if b, err := os.ReadFile(filepath.Join(local, "f")); err != nil || string(b) != "data" {
		t.Errorf("downloaded f: %q, %v", b, err)
	}
	if l, err := os.Readlink(filepath.Join(local, "l")); err != nil || l != "f" {
		t.Errorf("downloaded l -> %q, %v", l, err)
	}
	if fi, err := os.Stat(filepath.Join(local, "empty")); err != nil || fi.Mode().Perm() != 0o750 {
		t.Errorf("downloaded empty: %v, %v", fi, err)
	}
	for _, dir := range []string{".bashtask-tmp", ".bashtask-root"} {
		if _, err := os.Lstat(filepath.Join(local, dir)); !os.IsNotExist(err) {
			t.Errorf("the workspace's own %s was copied out: %v", dir, err)
		}
	}
	if _, err := os.Stat(filepath.Join(local, "empty", ".bashtask-tmp")); err != nil {
		t.Errorf("a task's own directory named .bashtask-tmp deeper in the tree was left out: %v", err)
	}

	_, errOut, err := bash(archiveCommand("w:gone", filepath.Join(ws, "gone"), nil), nil)
	if err == nil || strings.TrimSpace(errOut) != "w:gone: No such file or directory" {
		t.Errorf("a missing path: %v, stderr %q; want cp's message", err, errOut)
	}

	// Upload: a tree onto an existing directory goes inside it under its
	// own name; onto a missing path it becomes that path.
	var up bytes.Buffer
	if err := tarcopy.Write(&up, local); err != nil {
		t.Fatal(err)
	}
	into := filepath.Join(ws, "into")
	if err := os.Mkdir(into, 0o755); err != nil {
		t.Fatal(err)
	}
	for dest, want := range map[string]string{
		into:                                  filepath.Join(into, "copy", "f"),
		filepath.Join(ws, "new "+hostileName): filepath.Join(ws, "new "+hostileName, "f"),
	} {
		command, err := extractCommand("w:d", dest, filepath.Base(local))
		if err != nil {
			t.Fatal(err)
		}
		if _, errOut, err := bash(command, up.Bytes()); err != nil {
			t.Fatalf("extract into %s: %v: %s", dest, err, errOut)
		}
		if b, err := os.ReadFile(want); err != nil || string(b) != "data" {
			t.Errorf("uploaded to %s: %s holds %q, %v", dest, want, b, err)
		}
	}
	command, _ := extractCommand("w:no/such", filepath.Join(ws, "no", "such"), "copy")
	if _, errOut, err := bash(command, up.Bytes()); err == nil || !strings.Contains(errOut, "w:no/such: No such file or directory") {
		t.Errorf("an upload under a missing directory: %v, stderr %q", err, errOut)
	}
}

// The directories a copy out leaves out are the node's own names for
// them.
func TestWorkspaceInternalDirs(t *testing.T) {
	want := []string{
		bashtaskv1alpha1.WorkspacePath + "/" + shim.WorkspaceTmpDir,
		bashtaskv1alpha1.WorkspacePath + "/" + executor.WorkspaceRootDir,
	}
	if !slices.Equal(workspaceInternalDirs, want) {
		t.Errorf("workspaceInternalDirs = %q, want %q", workspaceInternalDirs, want)
	}
}
