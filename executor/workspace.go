package executor

import (
	"path"
	"strings"
)

// WorkspaceHome is where a workspace's root appears in the view of each of
// its tasks: their HOME and the directory paths of the workspace are
// relative to. The same as TaskHome, so that a task's tools find the
// same HOME with or without a workspace; the API names it
// (v1alpha1.WorkspacePath).
const WorkspaceHome = TaskHome

// WorkspaceOptions describe a workspace for [Executor.OpenWorkspace].
type WorkspaceOptions struct {
	// ID names the workspace (its API UID): one path element of
	// letters, digits, '-', '_' and '.'. Its root is the directory ID in
	// the executor's workspaces' directory (Config.WorkspaceDir), created
	// when missing: the mount point of its file system, or the plain
	// directory without one.
	ID string
	// Image is the absolute path of the workspace's file system image,
	// in a directory of the caller's that no task reaches (the agent's
	// state directory). When the executor has a disk quota and Image does
	// not exist, it is made (mkfs); when it exists it is mounted at Dir
	// unless it is already. Empty, or without a disk quota on the node:
	// Dir is a plain directory and [Workspace.StorageEnforced] is false.
	Image string
	// SizeBytes is the size of a new image in bytes; 0 means
	// Config.DiskQuotaBytes. Over Config.DiskQuotaCapBytes or below
	// MinDiskQuotaBytes it is ErrInvalidSpec. An existing image keeps
	// its size.
	SizeBytes int64
	// UID and GID own the workspace's root (mode 0700) and are the
	// identity every task of the workspace runs as.
	UID, GID uint32
	// Network is the network of the workspace's tasks: NetworkNode (the
	// agent's namespace), NetworkNone (a network namespace of the
	// workspace's own with loopback) or NetworkEgress (the same with a
	// veth pair and NAT, held for the workspace's life).
	Network Network
	// TakeOver says that the workspace is taken up from an earlier
	// process (an agent's restart): a file system image already mounted
	// is thawed first, in case that process stopped between the freeze
	// and the thaw of a fork's copy (Workspace.CopyImageFrozen), which
	// would leave every write to it blocked. The caller must have no copy
	// of its own under way.
	TakeOver bool
}

// WorkspaceTask is the workspace part of a Spec ([Spec.Workspace]).
type WorkspaceTask struct {
	// Workspace is the workspace the task runs in, as its UID and GID, in
	// its network, with its root at WorkspaceHome.
	Workspace *Workspace
	// Dir is the directory the shell starts in, relative to the
	// workspace's root ("" or "." for the root; an absolute path is taken
	// with the root as "/", and WorkspaceHome as a prefix is dropped
	// first). The shim resolves it as the task's user with
	// RESOLVE_IN_ROOT, so it cannot leave the workspace.
	Dir string
	// DirRequired makes a Dir that does not resolve to a directory a start
	// failure (ErrWorkingDirMissing, the spec's working directory); without
	// it (a carried directory) the shell starts at the root and the
	// Result's Message says so.
	DirRequired bool
	// Carry records the directory the shell ends in ([Result.Carry]).
	Carry bool
	// CarryEnv also records the variables the shell has exported when it
	// ends.
	CarryEnv bool
	// Env are the carried variables, placed after the terminal settings
	// and before the task's explicit Env (docs/executor.md,
	// "Environment", with the carried step after the terminal settings).
	Env []EnvVar
}

// Carry is what a workspace task's shell left for the next task.
type Carry struct {
	// Recorded is true when the shell recorded its end state; Dir and
	// Env are then that state, else Why says why there is none.
	Recorded bool
	// Dir is the directory the shell ended in, as the task saw it (an
	// absolute path, WorkspaceHome or below when inside the workspace).
	Dir string
	// Env are the variables the shell had exported (CarryEnv), in the
	// shell's order, unfiltered: the caller drops what must not carry.
	Env []EnvVar
	// Why says why nothing was recorded.
	Why string
}

// WorkspaceDirIn turns a start directory of a workspace task (relative to
// the root, or absolute with the root as "/" or below WorkspaceHome) into
// a clean relative path, "" for the root. ".." cannot climb above the
// root here either; the shim's RESOLVE_IN_ROOT is the rule that holds
// against symbolic links.
func WorkspaceDirIn(dir string) string {
	if dir == WorkspaceHome || strings.HasPrefix(dir, WorkspaceHome+"/") {
		dir = strings.TrimPrefix(dir, WorkspaceHome)
	}
	rel := strings.TrimPrefix(path.Clean("/"+dir), "/")
	return rel
}

// WorkspaceView is the task view of a directory relative to a workspace's
// root: WorkspaceHome, or below it.
func WorkspaceView(rel string) string {
	if rel == "" || rel == "." {
		return WorkspaceHome
	}
	return WorkspaceHome + "/" + rel
}

// Workspace is a workspace's node side as the executor holds it: its
// root directory (a mounted file system of its own, or a plain
// directory), its identity and its network namespace. Tasks name it in
// [Spec.Workspace]. Close ends the executor's hold without touching the
// files; Remove deletes the workspace. Its methods are safe for
// concurrent use.
type Workspace struct {
	id       string
	dir      string
	image    string // "" without a file system of its own
	size     int64  // the file system's size in bytes, 0 without
	uid, gid uint32
	network  Network
	// thawedAtOpen: see ThawedAtOpen.
	thawedAtOpen bool

	sys workspaceSys // platform part
}

// ThawedAtOpen reports whether OpenWorkspace, taking the workspace over
// (WorkspaceOptions.TakeOver), found its file system frozen and thawed
// it.
func (w *Workspace) ThawedAtOpen() bool { return w.thawedAtOpen }

// ID is the workspace's name given at OpenWorkspace.
func (w *Workspace) ID() string { return w.id }

// Dir is the node path of the workspace's root.
func (w *Workspace) Dir() string { return w.dir }

// UID is the user id (and GID the group id) the workspace's tasks run as.
func (w *Workspace) UID() uint32 { return w.uid }

// GID is the workspace's group id.
func (w *Workspace) GID() uint32 { return w.gid }

// Network is the network of the workspace's tasks.
func (w *Workspace) Network() Network { return w.network }

// StorageEnforced reports whether the workspace has a file system of its
// own with a size limit (else it is a plain directory).
func (w *Workspace) StorageEnforced() bool { return w.image != "" }

// CapacityBytes is the size of the workspace's file system in bytes, 0
// without one.
func (w *Workspace) CapacityBytes() int64 { return w.size }
