package executor

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/bashtask/bashtask-operator/executor/shim"
	"github.com/bashtask/bashtask-operator/executor/snapshot"
)

// Snapshot archives the workspace's tree to wr in the format of package
// snapshot, with state after it and without its temporary directory
// (shim.WorkspaceTmpDir, the tasks' /tmp), while its tasks may go on running (the
// package's doc says what that captures). A workspace whose tasks ran in
// an image has its image root's upper directory (WorkspaceRootDir/upper,
// see [Workspace.RootDirs]) archived as the archive's upper directory,
// and never its work directory. The tree is read through the
// root's descriptor the executor opened, never through a path a task
// controls. Errors are those of snapshot.Write, or that the workspace is
// closed.
func (w *Workspace) Snapshot(ctx context.Context, wr io.Writer, state []snapshot.StateFile) (*snapshot.Stats, error) {
	root, err := w.rootDup()
	if err != nil {
		return nil, err
	}
	defer root.Close()
	o := snapshot.WriteOptions{UID: w.uid, State: state, Exclude: []string{shim.WorkspaceTmpDir}}
	upper, err := openUpper(root)
	if err != nil {
		return nil, fmt.Errorf("snapshot of workspace %s: %w", w.id, err)
	}
	if upper != nil {
		defer upper.Close()
		o.Upper = upper
		o.Exclude = append(o.Exclude, WorkspaceRootDir)
	}
	st, err := snapshot.Write(ctx, wr, root, o)
	if err != nil {
		return nil, fmt.Errorf("snapshot of workspace %s: %w", w.id, err)
	}
	return st, nil
}

// Restore fills the workspace's tree, which must be empty (a workspace
// just made; a fresh file system's lost+found aside), from the archive r,
// every entry owned by the workspace's UID and GID, and hands each state
// file to state. No task may run in the workspace meanwhile. Errors are
// those of snapshot.Read (ErrFormat for a bad archive), or that the
// workspace is closed or not empty.
func (w *Workspace) Restore(ctx context.Context, r io.Reader, state func(snapshot.StateFile) error) (*snapshot.Stats, error) {
	root, err := w.rootDup()
	if err != nil {
		return nil, err
	}
	defer root.Close()
	names, err := root.Readdirnames(-1)
	if err != nil {
		return nil, fmt.Errorf("restore of workspace %s: reading its root: %w", w.id, err)
	}
	for _, n := range names {
		if n != "lost+found" {
			return nil, fmt.Errorf("restore of workspace %s: its root is not empty (%q)", w.id, n)
		}
	}
	st, err := snapshot.Read(ctx, r, root, snapshot.ReadOptions{UID: w.uid, GID: w.gid, State: state, Upper: func() (*os.File, error) {
		if _, _, err := w.RootDirs(); err != nil {
			return nil, err
		}
		f, err := openUpper(root)
		if err == nil && f == nil {
			err = errors.New("the upper directory was not made")
		}
		return f, err
	}})
	if err != nil {
		return nil, fmt.Errorf("restore of workspace %s: %w", w.id, err)
	}
	return st, nil
}

// rootDup returns a descriptor of its own on the workspace's root, for a
// walk that must not race Close.
func (w *Workspace) rootDup() (*os.File, error) {
	fd, err := w.dupRoot()
	if err != nil {
		return nil, err
	}
	return os.NewFile(uintptr(fd), w.dir), nil
}
