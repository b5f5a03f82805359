//go:build !linux

package executor

// workspaceSys exists only on Linux.
type workspaceSys struct{}

// OpenWorkspace needs Linux: it returns ErrUnsupported.
func (e *Executor) OpenWorkspace(WorkspaceOptions) (*Workspace, error) { return nil, ErrUnsupported }

// UsedBytes needs Linux.
func (w *Workspace) UsedBytes() (int64, error) { return 0, ErrUnsupported }

// Close needs Linux.
func (w *Workspace) Close() error { return nil }

// Remove needs Linux.
func (w *Workspace) Remove() error { return ErrUnsupported }
