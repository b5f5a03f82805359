// Package shim is the task shim of the tenant isolation level: the agent's
// own binary re-executed in a shim mode, as PID 1 of a task's new mount,
// PID, IPC and UTS namespaces (and network namespace when asked). It
// applies the task's isolation in a fixed order of named steps (mounts,
// with [Config.Root] inside an image's root, the shell, user names and
// home, host name, loopback, limits, identity, session
// keyring, no_new_privs, Landlock, seccomp),
// then forks the shell, forwards SIGTERM, SIGINT and SIGHUP to every process
// of its PID namespace, reaps every orphan and exits with the shell's status
// once the last process of the namespace is gone.
//
// The parent gives the shim its [Config] as JSON on descriptor [ConfigFD]
// and reads its [Report] lines on descriptor [ReportFD]: "ready <protocol>"
// ([ReadyLine]) once the shim runs, then either "error <step>: <message>" when a step failed
// (nothing of the command ran), or "started <pid>" and, when the shell
// exits, "exit <wait status>"; a workspace task's shim also writes
// "workdir <json>" before "started" and "carry <json>" before "exit"
// ([WorkspaceConfig]), and a fenced task's shim "fenced" before "exit"
// when it stopped the task ([Config.LeaseMillis]). Standard
// input (or /dev/null, [Config.NullStdin]), output and error (descriptors
// 0 to 2) are handed to the shell. The shim does nothing before its Config
// arrives, so the parent may start it ahead of its task and hand it the
// Config later; a shim whose config pipe closes empty exits.
package shim

import (
	"encoding/json"
	"fmt"
	"os"
	"path"
	"strconv"
	"strings"
)

// Arg0 is the argv[0] that selects the shim mode of a binary that calls
// [Main] at the start of its main function (and of TestMain).
const Arg0 = "bashtask-shim"

// ExecArg0 is the argv[0] of the shim's second stage for a task that is
// root inside ([RootConfig.RootInside]): the process the shim forks
// into the task's user namespace, which drops every capability there,
// joins a session keyring of its own, applies the Landlock ruleset and
// the seccomp filter, and executes the shell. [Main] runs it too.
const ExecArg0 = "bashtask-shim-exec"

// Descriptors the parent passes besides 0, 1 and 2.
const (
	// ConfigFD is the shim's end of a Unix stream socket carrying the
	// JSON [Config] (and the working directory, [Config.WorkTree]) up to
	// the parent's shutdown of its end.
	ConfigFD = 3
	// ReportFD is the write end of the pipe the shim reports on.
	ReportFD = 4
)

// Config is what the shim applies and runs.
type Config struct {
	// Shell is the absolute path of the shell, run as `Shell -c Command`.
	Shell string `json:"shell"`
	// Command is the string given to `Shell -c`.
	Command string `json:"command"`
	// Env is the shell's whole environment as NAME=VALUE strings.
	Env []string `json:"env"`
	// WorkDir is the absolute working directory of the shell; it stays
	// writable, the rest of the root file system is read-only.
	WorkDir string `json:"workDir"`
	// WorkTree says that the Config's first bytes carry, as SCM_RIGHTS
	// on the config socket, a detached clone of the working directory's
	// mounts (open_tree(2) OPEN_TREE_CLONE) taken by the parent, which the
	// shim attaches at WorkDir instead of cloning WorkDir of its own
	// mount namespace: a shim started ahead of its task has the mounts of
	// its start, not a file system mounted at WorkDir since.
	WorkTree bool `json:"workTree,omitempty"`
	// Terminal gives the shell a terminal instead of the shim's standard
	// streams (see [TerminalConfig]); NullStdin is then ignored.
	Terminal *TerminalConfig `json:"terminal,omitempty"`
	// NullStdin gives the shell /dev/null as standard input, a character
	// device (`test -c /dev/stdin` holds), instead of the shim's own
	// standard input.
	NullStdin bool `json:"nullStdin,omitempty"`
	// TmpSizeBytes caps each of the private tmpfs on /tmp and /dev/shm, in
	// bytes; 0 means the kernel's default (half of the RAM).
	TmpSizeBytes int64 `json:"tmpSizeBytes,omitempty"`
	// Mask lists absolute paths hidden from the task: a directory gets an
	// empty read-only tmpfs over it, a file /dev/null; missing paths are
	// skipped. For the agent's state, TLS and credential files, which the
	// read-only root would otherwise leave readable to whom their mode
	// allows.
	Mask []string `json:"mask,omitempty"`
	// Hostname is the host name in the task's UTS namespace; empty keeps
	// the node's.
	Hostname string `json:"hostname,omitempty"`
	// Loopback brings up lo: the shim runs in a new network namespace.
	Loopback bool `json:"loopback,omitempty"`
	// ResolvConf is the absolute path of a file bound read-only over
	// /etc/resolv.conf (the resolvers of network Egress); empty keeps the
	// node's. It is bound before anything is mounted over its directory
	// (a file under /tmp stays usable) and /etc/resolv.conf must exist.
	ResolvConf string `json:"resolvConf,omitempty"`
	// RunPaths are paths under /run (see [CheckRunPath]) of the node's
	// /run bound back, read-only, into the task's own /run at the same
	// path: the sockets of node daemons that tasks need. A path missing on
	// the node is skipped; one whose symbolic links lead out of /run
	// fails the mount step. The file /etc/resolv.conf leads to is bound
	// back too when it lies under /run.
	RunPaths []string `json:"runPaths,omitempty"`
	// NProc is RLIMIT_NPROC (processes and threads of the task's UID); 0
	// leaves the limit as inherited.
	NProc uint64 `json:"nproc,omitempty"`
	// UID and GID are the identity the shim drops to before it forks the
	// shell, with no supplementary groups; nil keeps the shim's.
	UID *uint32 `json:"uid,omitempty"`
	GID *uint32 `json:"gid,omitempty"`
	// User names UID and GID in the task's view: with UID and GID set,
	// the shim puts a copy of the node's (with Root, the image's)
	// /etc/passwd and /etc/group with
	// one more entry each (and none other for that name or id) read-only
	// over the node's, so that whoami, getpwuid(3) and ls -l find a name;
	// nil leaves the node's files.
	User *UserEntry `json:"user,omitempty"`
	// Landlock applies the Landlock rules best effort (nothing on a kernel
	// without Landlock).
	Landlock bool `json:"landlock,omitempty"`
	// SeccompFilter is the seccomp filter the shim installs on the shell,
	// as [EncodeFilter] encodes it: the program the agent assembled once
	// from its tables (package executor/seccomp); empty for none.
	SeccompFilter []byte `json:"seccompFilter,omitempty"`
	// NetNS says that the Config's descriptors carry, after the work
	// tree (and before RootConfig.IDMapped's and the lease's), a network namespace (a workspace's) that the shim joins
	// with setns(2) before its first other step; the shim is then started
	// without a network namespace of its own and Loopback is false (the
	// namespace's owner brought lo up).
	NetNS bool `json:"netns,omitempty"`
	// Workspace makes the task a workspace task (see [WorkspaceConfig]);
	// WorkTree and User with UID and GID are then required, WorkDir is
	// User.Home and PrivateHome is false.
	Workspace *WorkspaceConfig `json:"workspace,omitempty"`
	// LeaseMillis fences the task, in milliseconds: the Config's
	// descriptors carry, last, the read end of a pipe on which the parent
	// writes a byte for every renewal of the node's lease on its
	// workspaces; when none came for LeaseMillis, or the pipe's other end
	// closed (the parent died), the shim kills every process of its PID
	// namespace with SIGKILL and starts no shell. 0 fences nothing.
	LeaseMillis int64 `json:"leaseMillis,omitempty"`
	// Root gives the task a root file system of its own, an OCI image's
	// layers under an overlay, instead of the node's read-only root (see
	// [RootConfig]); nil keeps the node's. Shell is then ignored: the
	// shell is the image's bash.
	Root *RootConfig `json:"root,omitempty"`
}

// TerminalConfig is a task's terminal (docs/executor.md, "A terminal"):
// the mount step puts a devpts instance of the task's own on /dev/pts
// (/dev/ptmx a link to its pts/ptmx), the terminal step opens a
// pseudo-terminal pair there as the task's UID, which so owns the slave,
// sets its window size, and sends the master back on the config socket
// ([ConfigFD]) as SCM_RIGHTS with the one byte [TerminalMessage], before
// the "started" report; the shell gets the slave as descriptors 0, 1 and
// 2 and as its controlling terminal (setsid, TIOCSCTTY), so the line
// discipline turns ^C, ^Z and ^\ into signals to its foreground process
// group. The shim keeps no copy of either end.
type TerminalConfig struct {
	// Rows and Cols are the initial window size in character cells; 0
	// leaves the kernel's 0x0.
	Rows uint16 `json:"rows,omitempty"`
	Cols uint16 `json:"cols,omitempty"`
}

// TerminalMessage is the byte that carries the terminal's master on the
// config socket.
const TerminalMessage = 't'

// RootConfig is the task's root file system (docs/images.md, "The
// task's root file system"): an overlay of an image's layer directories
// with a writable upper directory, mounted nosuid and nodev, into which
// the shim moves (pivot_root(2)) before the rest of the mount step, so
// that nothing of the node's root stays reachable.
type RootConfig struct {
	// Image is the image's reference, for messages only.
	Image string `json:"image"`
	// LowerDirs are the absolute node paths of the image's layer
	// directories in overlayfs's on-disk format (whiteouts as 0/0
	// character devices, opaque directories marked with the
	// trusted.overlay.opaque xattr), the topmost layer first; 1 to
	// [MaxLowerDirs].
	LowerDirs []string `json:"lowerDirs"`
	// UpperDir and WorkDir are overlayfs's upper and work directories,
	// on one file system: absolute node paths, or paths relative to the
	// working directory's tree (a workspace task's: the workspace's
	// root; clean, no ".."), resolved beneath that tree without
	// following symbolic links, so that the image's changes live on the
	// workspace's, or the task's disk quota's, file system.
	UpperDir string `json:"upperDir"`
	WorkDir  string `json:"workDir"`
	// IDMapped says that the Config's descriptors carry, after the
	// network namespace, a user namespace whose maps the shim gives the
	// layers (idmapped mounts, MOUNT_ATTR_IDMAP): with 0 mapped to the
	// task's UID and GID the image's root-owned files are the task's, so
	// that it may change them (in the upper directory); the upper
	// directory's root becomes the task's too. Requires UID and GID.
	IDMapped bool `json:"idMapped,omitempty"`
	// RootInside runs the task as root inside a user namespace of its
	// own that maps uid and gid 0 to the task's UID and GID and nothing
	// else (setgroups denied), with no capability (docs/images.md, "Root
	// inside"): programs that insist on uid 0 (apt-get, dpkg) run, while
	// the kernel sees the task's UID. The namespace is made when the
	// shell is forked ([ExecArg0]), which also applies Landlock and
	// seccomp in it. Requires IDMapped, so that uid 0 inside owns the
	// image's root-owned files.
	RootInside bool `json:"rootInside,omitempty"`
}

// MaxLowerDirs is the most layer directories a [RootConfig] may name:
// overlayfs's own limit on lower layers (OVL_MAX_STACK).
const MaxLowerDirs = 500

// RootShells are the paths, in the image, where the shim looks for bash,
// in this order; an image with neither fails the "shell" step
// ([StepShell]).
var RootShells = []string{"/bin/bash", "/usr/bin/bash"}

// StepShell is the step that fails, before anything of the task runs,
// when a task's image ([Config.Root]) has no bash at any of [RootShells].
const StepShell = "shell"

// Validate checks r's form: an image reference without a newline, 1 to
// MaxLowerDirs clean absolute lower directories, and clean upper and
// work directories that are absolute, or relative without "..".
func (r RootConfig) Validate() error {
	if strings.ContainsAny(r.Image, "\n\x00") {
		return fmt.Errorf("root image %q contains a newline or NUL", r.Image)
	}
	if n := len(r.LowerDirs); n == 0 || n > MaxLowerDirs {
		return fmt.Errorf("root of image %s: %d lower directories, want 1 to %d", r.Image, n, MaxLowerDirs)
	}
	for _, d := range r.LowerDirs {
		if !path.IsAbs(d) || path.Clean(d) != d {
			return fmt.Errorf("root of image %s: lower directory %q is not a clean absolute path", r.Image, d)
		}
	}
	for name, d := range map[string]string{"upper": r.UpperDir, "work": r.WorkDir} {
		if d == "" || path.Clean(d) != d || d == ".." || strings.HasPrefix(d, "../") {
			return fmt.Errorf("root of image %s: %s directory %q is not a clean path free of \"..\"", r.Image, name, d)
		}
	}
	return nil
}

// UserEntry is the task's user in the passwd and group files of its
// mount namespace (see [Config.User]).
type UserEntry struct {
	// Name is the user's and the group's name, a POSIX portable user
	// name (letters, digits, '.', '_', '-', not starting with '-').
	Name string `json:"name"`
	// Gecos is the passwd comment field, the user's full name (git
	// takes its author name from it); no ':' or newline.
	Gecos string `json:"gecos,omitempty"`
	// Home is the absolute path of the home directory in the task's view.
	Home string `json:"home"`
	// PrivateHome makes Home a fresh empty directory owned by the task on
	// a private tmpfs (capped at TmpSizeBytes) mounted over Home's parent
	// directory, which must exist on the node (/home on every Debian
	// root). Without it Home must already be a directory the task may
	// write, e.g. inside its working directory.
	PrivateHome bool `json:"privateHome,omitempty"`
}

// Report is one line the shim writes on [ReportFD].
type Report struct {
	// Ready is true for the "ready" report, the first the shim writes: it
	// has started and waits for its Config.
	Ready bool
	// Step names the step that failed; empty when none did.
	Step string
	// Err is the failed step's message.
	Err string
	// PID is the shell's pid in the task's PID namespace ("started").
	PID int
	// Exited is true for an "exit" report; Status is then the shell's
	// wait status (syscall.WaitStatus).
	Exited bool
	Status uint32
	// WorkDir is set by a "workdir" report, which a workspace task's shim
	// writes before "started": the directory the shell starts in, in
	// the task's view, and Note why it is not the one asked for (empty
	// when it is).
	WorkDir *StartDir
	// Carry is set by a "carry" report, which a workspace task's shim
	// with WorkspaceConfig.Carry writes before "exit".
	Carry *Carry
	// Fenced is true for a "fenced" report, which a fenced task's shim
	// (Config.LeaseMillis) writes before "exit" when it killed the task
	// because its lease lapsed.
	Fenced bool
}

// StartDir is the body of a "workdir" report.
type StartDir struct {
	// Dir is the absolute directory the shell starts in, as the task sees
	// it.
	Dir string `json:"dir"`
	// Note says why Dir is not the directory asked for.
	Note string `json:"note,omitempty"`
}

// Protocol is the version of the Config and report formats. The agent
// may start a shim binary of its own (bashtask-shim, shipped beside it)
// rather than itself, and a shim of another build could read a Config it
// does not understand; the ready report names the shim's Protocol and the
// executor refuses a shim whose Protocol is not its own. Any change to
// [Config] or to the reports bumps it.
const Protocol = "8"

// ReadyLine is the shim's first report, written once it runs and before it
// reads its Config: "ready" and the shim's [Protocol].
const ReadyLine = "ready " + Protocol + "\n"

// ParseReport parses one report line without its newline. It returns an
// error for a line that is none of the seven forms.
func ParseReport(line string) (Report, error) {
	kind, rest, _ := strings.Cut(line, " ")
	switch kind {
	case "ready":
		if rest != Protocol {
			return Report{}, fmt.Errorf("the shim speaks protocol %q, this executor %q: it is not of this build", rest, Protocol)
		}
		return Report{Ready: true}, nil
	case "error":
		step, msg, _ := strings.Cut(rest, ": ")
		return Report{Step: step, Err: msg}, nil
	case "started":
		pid, err := strconv.Atoi(rest)
		if err == nil {
			return Report{PID: pid}, nil
		}
	case "exit":
		st, err := strconv.ParseUint(rest, 10, 32)
		if err == nil {
			return Report{Exited: true, Status: uint32(st)}, nil
		}
	case "workdir":
		var d StartDir
		if err := json.Unmarshal([]byte(rest), &d); err == nil {
			return Report{WorkDir: &d}, nil
		}
	case "fenced":
		if rest == "" {
			return Report{Fenced: true}, nil
		}
	case "carry":
		var c Carry
		if err := json.Unmarshal([]byte(rest), &c); err == nil {
			return Report{Carry: &c}, nil
		}
	}
	return Report{}, fmt.Errorf("shim report %q is not understood", line)
}

// init runs the shim as early as the package initialization order allows
// (packages are initialized in dependency order, ties broken by import
// path): in the agent's binary, before most of the packages it links, whose
// initialization would otherwise cost a shim start several milliseconds.
func init() { Main() }

// The shim's arguments after [Arg0] are directories whose mounts it
// detaches from its mount namespace when it starts, before it reports
// ready: the workspaces' directory, whose file systems a task reaches only
// through the tree its Config brings, and whose copies in the shim's
// namespace would otherwise hold them mounted for the task's life.

// Main runs the shim and never returns when os.Args[0] is [Arg0]; in any
// other process it returns at once. The package's init calls it; calling
// it first in main as well documents that the binary is a shim too.
func Main() {
	if len(os.Args) == 0 {
		return
	}
	switch os.Args[0] {
	case Arg0:
		os.Exit(run())
	case ExecArg0:
		os.Exit(execInside(os.Args[1:]))
	}
}

// Validate checks what the passwd format and Config.User require: a
// portable user name (POSIX: letters, digits, '.', '_' and '-', not
// starting with '-'; at most 32 bytes, useradd's limit), a gecos field
// without ':' or a newline, and an absolute home path of at least two
// elements (its parent is where PrivateHome mounts).
func (u UserEntry) Validate() error {
	switch {
	case u.Name == "" || len(u.Name) > 32 || u.Name[0] == '-':
		return fmt.Errorf("user name %q: want 1 to 32 bytes, not starting with '-'", u.Name)
	case strings.ContainsAny(u.Gecos, ":\n"):
		return fmt.Errorf("gecos %q contains ':' or a newline", u.Gecos)
	case !strings.HasPrefix(u.Home, "/") || strings.ContainsAny(u.Home, ":\n") || strings.Count(strings.TrimSuffix(u.Home, "/"), "/") < 2 && u.PrivateHome:
		return fmt.Errorf("home %q: want an absolute path (below a parent directory when private), no ':' or newline", u.Home)
	}
	for _, c := range u.Name {
		portable := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-'
		if !portable {
			return fmt.Errorf("user name %q: %q is not a portable character", u.Name, c)
		}
	}
	return nil
}

// CheckRunPath checks a path of [Config.RunPaths]: absolute, clean (no
// "..", ".", repeated or trailing slashes) and below /run.
func CheckRunPath(p string) error {
	if !strings.HasPrefix(p, "/run/") || path.Clean(p) != p {
		return fmt.Errorf("run path %q: want a clean absolute path below /run, no .. in it", p)
	}
	return nil
}

// PasswdWithUser returns the passwd file node (passwd(5) lines) without
// any entry named u.Name or of the id uid, plus the entry of u with uid,
// gid and shell. The node's other entries stay so that the files of root
// and of the system users keep their names in ls -l.
func PasswdWithUser(node []byte, u UserEntry, uid, gid uint32, shell string) []byte {
	out := withoutEntry(node, u.Name, uid)
	return fmt.Appendf(out, "%s:x:%d:%d:%s:%s:%s\n", u.Name, uid, gid, u.Gecos, u.Home, shell)
}

// GroupWithUser returns the group file node (group(5) lines) without any
// group named name or of the id gid, plus the group name with gid and no
// members.
func GroupWithUser(node []byte, name string, gid uint32) []byte {
	out := withoutEntry(node, name, gid)
	return fmt.Appendf(out, "%s:x:%d:\n", name, gid)
}

// withoutEntry copies the lines of a passwd or group file except those
// whose first field is name or whose third field (the id) is id; the copy
// ends with a newline unless empty.
func withoutEntry(file []byte, name string, id uint32) []byte {
	out := make([]byte, 0, len(file)+128)
	idStr := strconv.FormatUint(uint64(id), 10)
	for line := range strings.Lines(string(file)) {
		fields := strings.SplitN(strings.TrimSuffix(line, "\n"), ":", 4)
		if fields[0] == name || len(fields) > 2 && fields[2] == idStr {
			continue
		}
		out = append(out, line...)
		if !strings.HasSuffix(line, "\n") {
			out = append(out, '\n')
		}
	}
	return out
}
