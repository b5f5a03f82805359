package executor

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/bashtask/bashtask-operator/executor/shim"
)

// WorkspaceRootDir is the directory below a workspace's root holding the
// upper and work directories of its tasks' image root (Spec.Root): on
// the workspace's file system, so that what its tasks change in the
// image lasts as long as the workspace, counts against its size and is
// in its snapshots. Root's, mode 0700: the task sees it in its HOME and
// cannot enter it. A task without a workspace whose working directory is
// a file system of its own (a disk quota) has its private pair there,
// under the same name.
const WorkspaceRootDir = ".bashtask-root"

// privateRootPrefix starts the name of the directory, under
// [Config.WorkDirRoot], holding a task's private upper and work
// directories (a task in an image without a workspace).
const privateRootPrefix = "bashtask-root-"

// prepareRoot checks p.Root (docs/images.md, "The task's root file
// system") and, for a task without a workspace, makes its private upper
// and work directories, removed when the task ends: upper (0755, the
// mode of the task's /) and work (0700) in a directory of root's, 0700,
// which is WorkspaceRootDir in the working directory when that is a file
// system of its own (a disk quota), so that the task's changes to its
// image count against it, else <work root>/bashtask-root-*. Its errors are [*StartError]s with ErrInvalidSpec naming the
// field.
func (e *Executor) prepareRoot(p *prepared) error {
	r := p.Root
	if r == nil {
		return nil
	}
	if e.isolation != IsolationTenant {
		return startErr(ErrInvalidSpec, "spec.root (a task in an image) needs the tenant isolation level", nil)
	}
	own := p.Workspace == nil
	if own != (r.UpperDir == "" && r.WorkDir == "") {
		return startErr(ErrInvalidSpec, "spec.root: the upper and work directories are the executor's for a task without a workspace and required for a workspace task", nil)
	}
	check := shim.RootConfig{Image: r.Image, LowerDirs: r.LowerDirs, UpperDir: cmpOr(r.UpperDir, "/"), WorkDir: cmpOr(r.WorkDir, "/")}
	if err := check.Validate(); err != nil {
		return startErr(ErrInvalidSpec, "spec.root", err)
	}
	if err := checkRootInside(p); err != nil {
		return err
	}
	for _, d := range r.LowerDirs {
		if fi, err := os.Stat(d); err != nil || !fi.IsDir() {
			return startErr(ErrInvalidSpec, fmt.Sprintf("spec.root: layer directory %s of image %s is not a directory", d, r.Image), err)
		}
	}
	if !own {
		return nil
	}
	dir, err := e.privateRootDir(p)
	if err != nil {
		return err
	}
	root := *r
	for _, d := range []struct {
		path *string
		name string
		mode os.FileMode
	}{{&root.UpperDir, "upper", 0o755}, {&root.WorkDir, "work", 0o700}} {
		if err := os.Mkdir(filepath.Join(dir, d.name), d.mode); err != nil {
			return startErr(ErrProcessStart, "making the task's root directory "+filepath.Join(dir, d.name), err)
		}
		*d.path = filepath.Join(dir, d.name)
		if p.quotaFS != nil {
			// The shim finds the working directory's file system by
			// the tree it is given, not by a path (mounted after a
			// pooled shim started, it is not in the shim's mounts).
			*d.path = WorkspaceRootDir + "/" + d.name
		}
	}
	p.Root = &root
	return nil
}

// privateRootDir makes the directory of a task's private upper and work
// directories (see prepareRoot); one in the working directory's own file
// system goes with it, one under the work root is p.ownRoot.
func (e *Executor) privateRootDir(p *prepared) (string, error) {
	if p.quotaFS != nil {
		dir := filepath.Join(p.WorkingDir, WorkspaceRootDir)
		if err := os.Mkdir(dir, 0o700); err != nil {
			return "", startErr(ErrProcessStart, "making the task's root directories in "+p.WorkingDir, err)
		}
		return dir, nil
	}
	dir, err := os.MkdirTemp(e.workRoot, privateRootPrefix)
	if err != nil {
		return "", startErr(ErrProcessStart, "making the task's root directories under "+e.workRoot, err)
	}
	p.ownRoot = dir
	return dir, nil
}

// cmpOr is s, or def when s is empty.
func cmpOr(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

// removeRoot removes a task's private upper and work directories, if it
// had them.
func (p *prepared) removeRoot() error {
	if p.ownRoot == "" {
		return nil
	}
	if err := os.RemoveAll(p.ownRoot); err != nil {
		return fmt.Errorf("removing the task's root directories %s: %w", p.ownRoot, err)
	}
	return nil
}

// checkRootInside checks what p.Root.RootInside needs: the task's own
// UID (Spec.User), which uid 0 of its user namespace maps to, and user
// namespaces on the node ([UserNamespaces]).
func checkRootInside(p *prepared) error {
	if !p.Root.RootInside {
		return nil
	}
	if p.User == nil {
		return startErr(ErrInvalidSpec, "spec.root.rootInside needs a UID of the task's own (spec.user): uid 0 inside maps to it", nil)
	}
	if err := UserNamespaces(); err != nil {
		return startErr(ErrInvalidSpec, "spec.root.rootInside", err)
	}
	return nil
}
