package executor

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/bashtask/bashtask-operator/executor/shim"
)

// privateRootPrefix starts the name of the directory, under
// [Config.WorkDirRoot], holding a task's private upper and work
// directories (a task in an image without a workspace).
const privateRootPrefix = "bashtask-root-"

// prepareRoot checks p.Root (docs/images.md, "The task's root file
// system") and, for a task without a workspace, makes its private upper
// and work directories: <work root>/bashtask-root-*/{upper,work}, root's,
// 0700 (the upper 0755: it is the mode of the task's /), removed when the
// task ends. Its errors are [*StartError]s with ErrInvalidSpec naming the
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
	for _, d := range r.LowerDirs {
		if fi, err := os.Stat(d); err != nil || !fi.IsDir() {
			return startErr(ErrInvalidSpec, fmt.Sprintf("spec.root: layer directory %s of image %s is not a directory", d, r.Image), err)
		}
	}
	if !own {
		return nil
	}
	dir, err := os.MkdirTemp(e.workRoot, privateRootPrefix)
	if err != nil {
		return startErr(ErrProcessStart, "making the task's root directories under "+e.workRoot, err)
	}
	p.ownRoot = dir
	root := *r
	root.UpperDir, root.WorkDir = filepath.Join(dir, "upper"), filepath.Join(dir, "work")
	for _, d := range []struct {
		path string
		mode os.FileMode
	}{{root.UpperDir, 0o755}, {root.WorkDir, 0o700}} {
		if err := os.Mkdir(d.path, d.mode); err != nil {
			return startErr(ErrProcessStart, "making the task's root directory "+d.path, err)
		}
	}
	p.Root = &root
	return nil
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
