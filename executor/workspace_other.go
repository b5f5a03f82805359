//go:build !linux

package executor

import (
	"context"
	"net"
	"os"
)

// workspaceSys exists only on Linux.
type workspaceSys struct{}

func (e *Executor) setupWorkspaceDir(Config) error { return nil }

func (e *Executor) closeWorkspaceDir() error { return nil }

// WorkspaceDir is empty: workspaces need Linux.
func (e *Executor) WorkspaceDir() string { return "" }

// OpenWorkspace needs Linux: it returns ErrUnsupported.
func (e *Executor) OpenWorkspace(WorkspaceOptions) (*Workspace, error) { return nil, ErrUnsupported }

// UsedBytes needs Linux.
func (w *Workspace) UsedBytes() (int64, error) { return 0, ErrUnsupported }

// Close needs Linux.
func (w *Workspace) Close() error { return nil }

// Remove needs Linux.
func (w *Workspace) Remove() error { return ErrUnsupported }

func (w *Workspace) dupRoot() (int, error) { return -1, ErrUnsupported }

// RootDirs is Linux only: it returns ErrUnsupported.
func (w *Workspace) RootDirs() (upper, work string, err error) { return "", "", ErrUnsupported }

// openUpper finds no upper directory off Linux.
func openUpper(*os.File) (*os.File, error) { return nil, nil }

// DialLoopback is unsupported outside Linux.
func (w *Workspace) DialLoopback(context.Context, int) (net.Conn, error) { return nil, ErrUnsupported }

// CopyImageFrozen needs Linux: it returns ErrUnsupported.
func (w *Workspace) CopyImageFrozen(string) (*ForkStats, error) { return nil, ErrUnsupported }

// Adopt needs Linux: it returns ErrUnsupported.
func (w *Workspace) Adopt(uint32, uint32) error { return ErrUnsupported }

// SetEgressPolicy needs Linux: it returns ErrUnsupported for a policy.
func (w *Workspace) SetEgressPolicy(p *EgressPolicy, _ func(EgressRefusal)) error {
	if p == nil {
		return nil
	}
	return ErrUnsupported
}

// trustBundle needs Linux: there is none.
func (w *Workspace) trustBundle() string { return "" }
