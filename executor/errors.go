package executor

import "errors"

// Pre-start check failures. Each is returned wrapped in a [*StartError], so
// callers test them with errors.Is and read the offending value from the
// error's message.
var (
	// ErrWorkingDirMissing: Spec.WorkingDir does not exist.
	ErrWorkingDirMissing = errors.New("working directory does not exist")
	// ErrWorkingDirNotDir: Spec.WorkingDir exists but is not a directory.
	ErrWorkingDirNotDir = errors.New("working directory is not a directory")
	// ErrShellMissing: the configured shell is not an executable regular file.
	ErrShellMissing = errors.New("shell not found or not executable")
	// ErrArgumentTooLong: the command or one NAME=VALUE environment entry is
	// MaxArgStrlen bytes or more with its NUL, or all of them together are
	// over ArgEnvLimit, so execve would fail with E2BIG; also returned when
	// execve itself reports E2BIG. The message gives the size and the
	// limit.
	ErrArgumentTooLong = errors.New("arguments or environment over the kernel's limit")
	// ErrCommandNUL: the command contains a NUL byte, which a C string
	// cannot carry.
	ErrCommandNUL = errors.New("command contains a NUL byte")
	// ErrEnvNameEmpty: an environment entry has an empty name.
	ErrEnvNameEmpty = errors.New("environment variable name is empty")
	// ErrEnvNameEquals: an environment name contains '=', which would make
	// the entry parse as a different name.
	ErrEnvNameEquals = errors.New("environment variable name contains '='")
	// ErrEnvNUL: an environment name or value contains a NUL byte.
	ErrEnvNUL = errors.New("environment variable contains a NUL byte")
	// ErrInvalidSpec: a Spec field is out of range (negative duration or
	// size, tail over MaxTailBytes, relative working directory, bad ID).
	ErrInvalidSpec = errors.New("invalid task spec")
	// ErrSpillDir: the spill directory is unusable (not a directory, or
	// readable by group or others) or a spill file already exists.
	ErrSpillDir = errors.New("unusable spill directory")
	// ErrProcessStart: the kernel refused to create the process or set up
	// its cgroup after all checks passed.
	ErrProcessStart = errors.New("cannot start process")
	// ErrIsolation: a step of the task shim failed at IsolationTenant (the
	// message names the step); nothing of the command ran.
	ErrIsolation = errors.New("cannot isolate task")
	// ErrLeaseExpired: a workspace task did not start because the node's
	// [Lease] on its workspaces runs less than one window ahead (no
	// controller watched the agent lately); its workspace may be restored
	// on another node already.
	ErrLeaseExpired = errors.New("the node's lease on its workspaces has expired")
	// ErrImageShellMissing: the task's image ([Spec.Root]) has bash at
	// none of shim.RootShells; the message names the image. Nothing of
	// the command ran: no other shell stands in for bash.
	ErrImageShellMissing = errors.New("the task's image has no bash")
	// ErrLimitsNotEnforced: the task asks for a resource limit its node
	// does not enforce, and the agent refuses such tasks rather than run
	// them without it (the message names the limits).
	ErrLimitsNotEnforced = errors.New("resource limits not enforced on this node")
)

// Configuration and environment errors returned by [New] and
// [BecomeSubreaper].
var (
	// ErrInvalidConfig: a Config field is out of range.
	ErrInvalidConfig = errors.New("invalid executor config")
	// ErrNoCgroupV2: CgroupRequired was asked for but no writable cgroup v2
	// hierarchy was found.
	ErrNoCgroupV2 = errors.New("no writable cgroup v2 hierarchy")
	// ErrUnsupported: the platform cannot run tasks (only Linux can).
	ErrUnsupported = errors.New("executor is not supported on this platform")
	// ErrTasksRunning: BecomeSubreaper was called while tasks started
	// without the reaper were still being waited on.
	ErrTasksRunning = errors.New("tasks are running")
)

// StartError reports that a task did not start. Kind is one of the
// sentinel errors above, so errors.Is(err, ErrWorkingDirMissing) works;
// Subject names what was checked (a path, an environment name) so the
// message points at the culprit rather than at the shell; Cause is the
// underlying system error, if any.
type StartError struct {
	Kind    error
	Subject string
	Cause   error
}

// Error returns "<kind>: <subject>: <cause>" with empty parts left out.
func (e *StartError) Error() string {
	s := e.Kind.Error()
	if e.Subject != "" {
		s += ": " + e.Subject
	}
	if e.Cause != nil {
		s += ": " + e.Cause.Error()
	}
	return s
}

// Unwrap returns Kind and Cause for errors.Is and errors.As.
func (e *StartError) Unwrap() []error {
	if e.Cause == nil {
		return []error{e.Kind}
	}
	return []error{e.Kind, e.Cause}
}

func startErr(kind error, subject string, cause error) *StartError {
	return &StartError{Kind: kind, Subject: subject, Cause: cause}
}

// StartFailedResult is the Result of a task whose Start returned err:
// reason StartFailed, exit code -1 and err's text as the message.
func StartFailedResult(err error) Result {
	return Result{Reason: ReasonStartFailed, Message: err.Error(), ExitCode: -1}
}
