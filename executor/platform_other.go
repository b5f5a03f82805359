//go:build !linux

package executor

// taskSys is empty where tasks cannot run.
type taskSys struct{}

// BecomeSubreaper returns ErrUnsupported outside Linux.
func BecomeSubreaper() error { return ErrUnsupported }

// IsSubreaper is always false outside Linux.
func IsSubreaper() bool { return false }

// OrphansReaped is always 0 outside Linux.
func OrphansReaped() int64 { return 0 }

// PID is the shell's process id; always 0 outside Linux, where no task
// starts.
func (t *Task) PID() int { return 0 }

// ProcessStart is the shell's start time in clock ticks after boot; always
// 0 outside Linux.
func (t *Task) ProcessStart() uint64 { return 0 }

// Isolation is the isolation the task got; always empty outside Linux.
func (t *Task) Isolation() IsolationResult { return IsolationResult{} }

// PooledShim reports whether the task took a shim started ahead of it;
// always false outside Linux.
func (t *Task) PooledShim() bool { return false }

// LimitsNotEnforced names the limits the task asked for that its node
// does not enforce; always nil outside Linux.
func (t *Task) LimitsNotEnforced() []string { return nil }

// CgroupPath is the task's own cgroup directory; always empty outside
// Linux.
func (t *Task) CgroupPath() string { return "" }

func setupCgroupParent(root, name string) (*cgroupParent, error) { return nil, ErrNoCgroupV2 }

func removeCgroup(path string) error { return nil }

func (e *Executor) start(p *prepared) (*Task, error) {
	return nil, startErr(ErrProcessStart, "", ErrUnsupported)
}

func (e *Executor) detectCapabilities() error { return nil }

// shimPool exists only on Linux.
type shimPool struct{}

func newShimPool(*Executor, int) *shimPool { return nil }

func (*shimPool) close() {}

func sweepPoolCgroups(string) error { return nil }

// CgroupProcs needs Linux.
func CgroupProcs(string) ([]int, error) { return nil, ErrNoCgroupV2 }

// KillCgroup needs Linux.
func KillCgroup(string) ([]int, error) { return nil, ErrNoCgroupV2 }

// idmaps holds nothing where no image root is made.
type idmaps struct{}

// close does nothing outside Linux.
func (*idmaps) close() {}

// UserNamespaces returns ErrUnsupported outside Linux.
func UserNamespaces() error { return ErrUnsupported }
