package executor

import (
	"fmt"
	"time"
)

// Reason is the single terminal cause of a task, from a closed set
// (docs/executor.md, "Stopping and completion"). The first cause wins: the deadline, then a cancel,
// then an OOM kill in the task's cgroup, then death by signal, then the exit
// code.
type Reason string

const (
	// ReasonSucceeded means the shell exited with status 0.
	ReasonSucceeded Reason = "Succeeded"
	// ReasonNonZeroExit means the shell exited with a status other than 0.
	ReasonNonZeroExit Reason = "NonZeroExit"
	// ReasonSignaled means the shell was killed by a signal the executor
	// did not send as part of a timeout or cancel (for example
	// `kill -TERM $$`).
	ReasonSignaled Reason = "Signaled"
	// ReasonTimedOut means the task's deadline passed before the shell
	// exited, whatever the exit status was afterwards (a command that traps
	// TERM and exits 0 is still TimedOut).
	ReasonTimedOut Reason = "TimedOut"
	// ReasonCancelled means [Task.Cancel] was called before the shell exited.
	ReasonCancelled Reason = "Cancelled"
	// ReasonOOMKilled means the kernel's OOM killer killed a process of the
	// task's cgroup (memory.events oom_kill > 0).
	ReasonOOMKilled Reason = "OOMKilled"
	// ReasonStartFailed means a pre-start check failed or the process could
	// not be created; nothing of the command ran. See [StartError].
	ReasonStartFailed Reason = "StartFailed"
)

// Mechanism says how the executor keeps hold of a task's processes.
type Mechanism string

const (
	// MechanismCgroup means the task has its own cgroup v2; the shell was
	// created inside it (CLONE_INTO_CGROUP), so every descendant, including
	// one that left the session with setsid, is found and killed through it.
	MechanismCgroup Mechanism = "cgroup"
	// MechanismProcessGroup means no writable cgroup v2 was found; the task
	// is its own session and process group, and a process that leaves them
	// escapes.
	MechanismProcessGroup Mechanism = "processGroup"
)

// AmbientMode says which part of the agent's own environment reaches a task
// (`--ambient-env`; docs/executor.md, "Environment").
type AmbientMode string

const (
	// AmbientScrub passes the agent's environment minus the names and
	// values [Scrubbed] and [ScrubbedValue] report (credential shapes,
	// BASHTASK_* names, shell start-up hooks). The process level's
	// default.
	AmbientScrub AmbientMode = "scrub"
	// AmbientAllowlist passes only the names listed in
	// [Config.AmbientAllowlist] (exact, case-sensitive match). The tenant
	// level's default, with an empty list: a task's environment is then
	// defined by the executor ([DefaultTaskPath], the identity, the
	// terminal settings, LANG) and the task, never inherited.
	AmbientAllowlist AmbientMode = "allowlist"
	// AmbientInherit passes the whole environment without a scrub; meant for
	// single-tenant nodes only.
	AmbientInherit AmbientMode = "inherit"
)

// DefaultAmbientMode is the ambient mode of an executor at level when its
// configuration names none: [AmbientAllowlist] at [IsolationTenant],
// where several owners share the agent, [AmbientScrub] otherwise.
func DefaultAmbientMode(level Isolation) AmbientMode {
	if level == IsolationTenant {
		return AmbientAllowlist
	}
	return AmbientScrub
}

// ParseAmbientMode converts a flag value to an [AmbientMode]. The empty
// string is returned as is: [New] then takes the level's default
// ([AmbientAllowlist] at the tenant level, [AmbientScrub] at the process
// level). It returns an error wrapping [ErrInvalidConfig] for any other
// unknown value.
func ParseAmbientMode(s string) (AmbientMode, error) {
	switch m := AmbientMode(s); m {
	case "", AmbientScrub, AmbientAllowlist, AmbientInherit:
		return m, nil
	}
	return "", fmt.Errorf("%w: ambient env mode %q is not one of scrub, allowlist, inherit", ErrInvalidConfig, s)
}

const (
	// MaxArgStrlen is the kernel's limit on one argv or envp string,
	// including its terminating NUL: MAX_ARG_STRLEN = 32 pages of 4096
	// bytes (include/uapi/linux/binfmts.h). execve fails with E2BIG above it,
	// so a command may be at most MaxArgStrlen-1 bytes and an environment
	// entry NAME=VALUE at most MaxArgStrlen-1 bytes.
	MaxArgStrlen = 32 * 4096

	// DefaultShell is the shell used when [Config.Shell] is empty.
	DefaultShell = "/bin/bash"
	// DefaultKillGrace is the time between SIGTERM and SIGKILL when
	// [Spec.KillGrace] is zero.
	DefaultKillGrace = 3 * time.Second
	// KillGraceNone is the [Spec.KillGrace] of a task stopped without a
	// grace period: SIGKILL follows SIGTERM at once. Zero cannot say it,
	// as it means DefaultKillGrace.
	KillGraceNone = time.Nanosecond
	// DefaultTailBytes is the per-stream tail size in bytes when
	// [Spec.TailBytes] is zero.
	DefaultTailBytes = 64000
	// MaxTailBytes is the largest per-stream tail in bytes (the
	// BashTask's output.tailBytes).
	MaxTailBytes = 262144
	// DefaultSpillLimitBytes is the per-stream spill file cap in bytes when
	// [Spec.SpillLimitBytes] is zero (64 MiB).
	DefaultSpillLimitBytes = 64 << 20
)

// EnvVar is one environment entry. Name must be non-empty and contain
// neither '=' nor NUL; Value must not contain NUL (execve takes C strings).
type EnvVar struct {
	Name  string
	Value string
}

// Limits are the resource limits of one task, applied through its cgroup
// when the matching controller is delegated to the executor's parent cgroup.
// A zero field means no limit.
type Limits struct {
	// MemoryBytes is written to memory.max (bytes); memory.swap.max is set
	// to 0 and memory.oom.group to 1 so the whole task is OOM-killed at once.
	MemoryBytes int64
	// CPUMillis is the CPU quota in thousandths of a CPU, written to
	// cpu.max as a quota per 100 ms period.
	CPUMillis int64
	// Pids is the maximum number of processes and threads (pids.max).
	Pids int64
	// DiskBytes is the size of the file system of the task's fresh
	// working directory at IsolationTenant, in bytes, when the executor
	// has a disk quota (Config.DiskQuotaBytes): 0 means that default, more
	// than Config.DiskQuotaCapBytes is ErrInvalidSpec. Not a cgroup limit.
	DiskBytes int64
}

// User is the identity a task runs as. The agent must run as root (or hold
// CAP_SETUID/CAP_SETGID) to use it.
type User struct {
	// UID and GID are the numeric user and primary group ids.
	UID, GID uint32
	// Groups are the supplementary group ids; nil means none (the agent's
	// own supplementary groups are always dropped).
	Groups []uint32
}

// Spec describes one command to run. Zero values select the documented
// defaults; negative durations and sizes are rejected with [ErrInvalidSpec].
type Spec struct {
	// ID names the task in the cgroup hierarchy (the cgroup is
	// <parent>/<ID>) and must be a single path element of letters, digits,
	// '-', '_' and '.'; empty means a random name.
	ID string
	// Command is the string given to `<shell> -c`; at most MaxArgStrlen-1
	// bytes, no NUL.
	Command string
	// Stdin is written to fd 0 through a pipe that is then closed. nil means
	// fd 0 is /dev/null; a non-nil empty slice means an empty pipe.
	Stdin []byte
	// StdinStream, when set, makes fd 0 a pipe fed by [Task.WriteStdin]
	// while the task runs; exclusive with Stdin.
	StdinStream *StdinStream
	// Terminal, when set, gives the task a terminal (docs/executor.md,
	// "A terminal"): fds 0, 1 and 2 are one pseudo-terminal's slave, the
	// shell's controlling terminal, and the master's output is the stdout
	// stream; [Task.Terminal] writes input and window sizes. Exclusive
	// with Stdin and StdinStream.
	Terminal *TerminalSpec
	// Env is the task's explicit environment (docs/executor.md,
	// "Environment"): it wins over the ambient environment, even for names that look
	// like credentials.
	Env []EnvVar
	// ManagedEnv holds the managed facts (BASHTASK_NAME, ...), applied last
	// so nothing can displace them.
	ManagedEnv []EnvVar
	// WorkingDir is the absolute directory the shell starts in. Empty means
	// a fresh directory under [Config.WorkDirRoot], owned by the task's user,
	// removed when the task ends.
	WorkingDir string
	// Timeout is measured on the monotonic clock from the start of the
	// shell, to the nanosecond asked (a 100 ms timeout is 100 ms); zero
	// means no deadline.
	Timeout time.Duration
	// KillGrace is the time between SIGTERM and SIGKILL; zero means
	// DefaultKillGrace, KillGraceNone none. Any duration is honoured,
	// also one under a second.
	KillGrace time.Duration
	// TailBytes is the size in bytes of the in-memory tail kept per stream;
	// zero means DefaultTailBytes; at most MaxTailBytes.
	TailBytes int
	// SpillLimitBytes caps each stream's spill file in bytes; zero means
	// DefaultSpillLimitBytes. Bytes past it are still counted and hashed.
	SpillLimitBytes int64
	// SpillDir is the directory that receives the files "stdout" and
	// "stderr" (mode 0600, each created exclusively with its stream's first
	// byte; Start refuses a directory where either name exists). When
	// missing it is created, mode 0700, with the first byte of output, so a
	// task that prints nothing leaves nothing there; an existing one must be
	// a directory with no group or other permission bits. Empty means a
	// fresh directory under the system temporary directory, made at Start
	// and reported in [StreamResult.SpillPath]; the caller removes it.
	SpillDir string
	// Limits are the requested resource limits.
	Limits Limits
	// User is the identity to run as; nil means the agent's own. At
	// IsolationTenant the shim drops to it (UID and GID; Groups are
	// ignored: a tenant has no supplementary groups).
	User *User
	// Network is the network the task reaches; empty means NetworkNode.
	// NetworkNone needs IsolationTenant, else Start fails with
	// ErrInvalidSpec.
	Network Network
	// Egress limits the names a task of NetworkEgress without a Workspace
	// reaches, as [Workspace.SetEgressPolicy] does for a workspace's; nil
	// allows everything. With another network or a Workspace, Start fails
	// with ErrInvalidSpec.
	Egress *EgressPolicy
	// EgressRefused, when not nil, is called for each name the task's
	// resolver refuses under Egress.
	EgressRefused func(EgressRefusal)
	// Workspace runs the task in a workspace (IsolationTenant only): as
	// its UID and GID, in its network, with its root at WorkspaceHome
	// (also HOME), starting in its Dir. WorkingDir, Network, User and
	// Limits.DiskBytes are then ignored; the task's /tmp, /dev/shm, IPC,
	// PID and UTS namespaces and cgroup are its own as for any task.
	Workspace *WorkspaceTask
	// Root runs the task in an OCI image's root file system instead of
	// the node's read-only root (IsolationTenant only; docs/images.md,
	// "The task's root file system"); nil keeps the node's.
	Root *Root
}

// Root is the root file system of a task in an image: an overlay of the
// image's layer directories (the image store's, unpacked in overlayfs's
// on-disk format) with a writable upper directory, which the task's shim
// moves into.
type Root struct {
	// Image is the image's reference, named in messages (a missing
	// shell's, say).
	Image string
	// LowerDirs are the absolute node paths of the image's layer
	// directories, the topmost first; 1 to shim.MaxLowerDirs.
	LowerDirs []string
	// UpperDir and WorkDir are overlayfs's upper and work directories,
	// on one file system. A task without a workspace leaves both empty:
	// the executor makes a private pair, in the working directory's file
	// system when it has one of its own (a disk quota, which then counts
	// the task's changes), else under [Config.WorkDirRoot], and removes
	// it when the task ends, so the task's changes go with it. A
	// workspace task names both: paths relative to the workspace's root,
	// resolved there without following symbolic links (see
	// [Workspace.RootDirs]), or absolute node paths.
	UpperDir, WorkDir string
	// RootInside runs the task as uid 0 of a user namespace of its own
	// that maps 0 to its UID and GID alone, without capabilities, so that
	// apt-get and dpkg run (docs/images.md, "Root inside"). Requires
	// Spec.User (a UID of the task's own) and user namespaces on the node
	// ([UserNamespaces]); else ErrInvalidSpec naming spec.root.rootInside.
	RootInside bool
}

// Result is everything known about a finished task.
type Result struct {
	// Reason is the terminal cause.
	Reason Reason
	// Message explains the reason in a sentence, and says when requested
	// limits were not enforced.
	Message string
	// ExitCode is the shell's exit status, 128+n when it was killed by
	// signal n (the container convention), or -1 when it never ran or its
	// status was lost.
	ExitCode int
	// Signal is the name of the signal that killed the shell ("SIGKILL"),
	// empty when it exited.
	Signal string
	// PID is the shell's process id, which is also its session and process
	// group id; 0 when it never ran. At IsolationTenant it is the node's id
	// of the task's shim (PID 1 of the task's PID namespace, the shell's
	// parent).
	PID int
	// StartTime and EndTime are wall-clock times of the start of the shell
	// and of the end of the whole task (all processes stopped, output read).
	StartTime, EndTime time.Time
	// LeftoverProcesses counts the processes of the task, other than the
	// shell, still alive when the shell's exit was observed; the executor
	// stopped them.
	LeftoverProcesses int
	// Mechanism says whether the task had its own cgroup.
	Mechanism Mechanism
	// LimitsNotEnforced names each requested limit ("memory", "cpu",
	// "pids") that could not be applied because the node does not delegate
	// the controller; empty when everything requested was applied.
	LimitsNotEnforced []string
	// CleanupFailed is true when the task's cgroup or its fresh working
	// directory could not be removed (Message says why): a process or file
	// of the task may remain, so a UID leased to it must not be reused.
	CleanupFailed bool
	// Isolation says what isolation the task got.
	Isolation IsolationResult
	// Stdout and Stderr describe the two output streams.
	Stdout, Stderr StreamResult
	// StartDir is, for a workspace task, the directory its shell started
	// in as the task saw it (WorkspaceHome or below); empty otherwise.
	StartDir string
	// Carry is, for a workspace task with WorkspaceTask.Carry that
	// started, what its shell left for the next task; nil otherwise.
	Carry *Carry
}

// StreamResult describes one output stream of a finished task.
type StreamResult struct {
	// Tail is the end of the stream, at most the task's TailBytes bytes,
	// starting on a UTF-8 boundary, with invalid UTF-8 replaced by U+FFFD.
	Tail string
	// TotalBytes counts every byte the task wrote to the stream.
	TotalBytes int64
	// Truncated is true when Tail is not the whole stream (a stream of
	// exactly TailBytes valid bytes is not truncated).
	Truncated bool
	// Sanitized is true when invalid UTF-8 was replaced in Tail.
	Sanitized bool
	// SHA256 is the lower-case hex SHA-256 of every byte of the stream,
	// including bytes past the spill limit.
	SHA256 string
	// SpillPath is the file holding the first SpillBytes bytes. It is
	// created with the stream's first byte: when SpillBytes is 0 the task
	// wrote nothing there, no file was created, and whatever may be at
	// SpillPath is not the task's and must not be read as its output.
	SpillPath string
	// SpillBytes is the number of bytes in the spill file.
	SpillBytes int64
	// SpillComplete is true when the spill file holds the whole stream.
	SpillComplete bool
}

// StreamSnapshot is the state of one stream of a running task.
type StreamSnapshot struct {
	// Tail is as in [StreamResult]; while the task runs a trailing
	// incomplete UTF-8 sequence is held back rather than replaced.
	Tail string
	// TotalBytes counts the bytes read so far.
	TotalBytes int64
	// Truncated and Sanitized are as in [StreamResult], for the bytes so far.
	Truncated, Sanitized bool
}

// Snapshot is the state of a running task's output.
type Snapshot struct {
	Stdout, Stderr StreamSnapshot
}
