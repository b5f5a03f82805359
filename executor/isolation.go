package executor

import (
	"fmt"
	"time"
)

// Isolation is the isolation level of an executor's tasks (the agent's
// --isolation flag; docs/executor.md, "The tenant level").
type Isolation string

const (
	// IsolationProcess runs each task in its own session, process group and
	// cgroup, as the user of [Spec.User]. The zero value means this.
	IsolationProcess Isolation = "process"
	// IsolationTenant runs each task under the task shim (package
	// executor/shim) as PID 1 of new mount, PID, IPC and UTS namespaces:
	// private /tmp and /dev/shm, /proc with hidepid=invisible, a read-only
	// root but for the working directory, the identity of [Spec.User] with
	// no supplementary groups, no_new_privs, Landlock where the kernel has
	// it, a seccomp filter, and with [NetworkNone] or [NetworkEgress] a
	// network namespace of its own.
	IsolationTenant Isolation = "tenant"
)

// ParseIsolation converts a flag value; empty selects IsolationProcess.
// Other values return an error wrapping ErrInvalidConfig.
func ParseIsolation(s string) (Isolation, error) {
	switch l := Isolation(s); l {
	case "":
		return IsolationProcess, nil
	case IsolationProcess, IsolationTenant:
		return l, nil
	}
	return "", fmt.Errorf("%w: isolation %q is not one of process, tenant", ErrInvalidConfig, s)
}

// Network is the network a task reaches.
type Network string

const (
	// NetworkNode shares the agent's network namespace: the task reaches
	// whatever the agent pod can. The zero value means this.
	NetworkNode Network = "node"
	// NetworkNone gives the task a network namespace of its own with only
	// loopback up (IsolationTenant only).
	NetworkNone Network = "none"
	// NetworkEgress gives the task a network namespace of its own with
	// loopback and a route out through the agent's network namespace (a
	// veth pair and NAT, see [EgressConfig]): the node's own addresses,
	// link-local addresses, the denied ranges and other tasks are out of
	// reach, the rest of the network is not (IsolationTenant only, and
	// only where [Config.Egress] is set and its setup succeeded).
	NetworkEgress Network = "egress"
)

// ParseNetwork converts a flag value; empty selects NetworkNode. Other
// values return an error wrapping ErrInvalidConfig.
func ParseNetwork(s string) (Network, error) {
	switch n := Network(s); n {
	case "":
		return NetworkNode, nil
	case NetworkNode, NetworkNone, NetworkEgress:
		return n, nil
	}
	return "", fmt.Errorf("%w: network %q is not one of node, none, egress", ErrInvalidConfig, s)
}

// Defaults of the tenant level.
const (
	// DefaultShimPath is the binary started in shim mode: the running
	// binary itself, which must call shim.Main first thing in main.
	DefaultShimPath = "/proc/self/exe"
	// DefaultShimReportTimeout is how long a task's shim may take to say
	// it runs, and then to start the shell or name the step that failed.
	DefaultShimReportTimeout = 30 * time.Second
	// DefaultHostname is the host name tasks see at the tenant level.
	DefaultHostname = "bashtask"
	// TaskUserName is the name of every task's leased UID and GID at the
	// tenant level, in the passwd and group files of the task's mount
	// namespace. One name for all: a task sees only its own entry (and
	// the node's), scripts and tools may count on it (HOME=/home/task),
	// and the UID behind it is the task's own; numeric ids stay what logs
	// and the status report (status.isolation.uid).
	TaskUserName = "task"
	// TaskUserGecos is the passwd comment (full name) of the task user:
	// git takes the author name of a commit from it when no user.name is
	// configured.
	TaskUserGecos = "BashTask task"
	// TaskHome is the task user's HOME at the tenant level: a fresh
	// directory owned by the task on a private tmpfs over /home (capped
	// like /tmp, gone with the task).
	TaskHome = "/home/" + TaskUserName
	// DefaultTmpSizeBytes caps each task's private /tmp and /dev/shm
	// (64 MiB each).
	DefaultTmpSizeBytes = 64 << 20
	// DefaultTaskProcs is the default number of processes and threads of
	// one task at the tenant level when the spec sets no pids limit.
	DefaultTaskProcs = 4096
	// DefaultShimPoolSize is how many task shims the tenant level keeps
	// started ahead of tasks, per network tasks ask for. Each is a
	// blocked Go process of a few MiB of memory.
	DefaultShimPoolSize = 2
	// PoolCgroupPrefix starts the names of the cgroups of shims started
	// ahead of tasks. A task that takes such a shim keeps its cgroup, so at
	// the tenant level a task's cgroup may be named so rather than after
	// its Spec.ID: Task.CgroupPath says which, once Start returned.
	PoolCgroupPrefix = "shim-"
)

// Names of the ways the default process limit is enforced
// ([IsolationResult.PidsLimit]).
const (
	// PidsLimitCgroup: pids.max of the task's cgroup.
	PidsLimitCgroup = "pids.max"
	// PidsLimitRlimit: RLIMIT_NPROC on the task's own UID, set by the shim.
	PidsLimitRlimit = "RLIMIT_NPROC"
)

// IsolationResult says what isolation a task got.
type IsolationResult struct {
	// Level is the isolation level.
	Level Isolation
	// UID is the task's user id, nil when it ran as the agent's user.
	UID *uint32
	// Namespaces lists the namespaces of its own ("mnt", "pid", "ipc",
	// "uts", "net"), empty at the process level.
	Namespaces []string
	// LandlockABI is the Landlock ABI version applied, 0 for none.
	LandlockABI int
	// Seccomp is true when the seccomp filter was installed.
	Seccomp bool
	// Network is the network the task reached.
	Network Network
	// PidsLimit names how the process limit was enforced (PidsLimitCgroup
	// or PidsLimitRlimit), empty when there was none.
	PidsLimit string
	// Procs is the process limit in processes and threads, 0 for none.
	Procs int64
}

// Capabilities is what the node allows for task isolation, detected by
// [New].
type Capabilities struct {
	// Namespaces is true when a task shim started in new mount, PID, IPC
	// and UTS namespaces and applied its mounts (probed at IsolationTenant
	// only).
	Namespaces bool
	// NetNS is true when the probe also got a network namespace with
	// loopback up (IsolationTenant only).
	NetNS bool
	// Egress is true when [NetworkEgress] is offered: Config.Egress was
	// set and its nftables table, forwarding and resolv.conf were set up
	// (IsolationTenant only). [Executor.EgressError] says why not.
	Egress bool
	// LandlockABI is the kernel's Landlock ABI version, 0 without Landlock.
	LandlockABI int
	// Seccomp is true when the kernel offers seccomp filters.
	Seccomp bool
	// Cgroup is true when tasks get a cgroup v2 of their own.
	Cgroup bool
	// Pids is true when task cgroups have the pids controller.
	Pids bool
	// DiskQuota is true when fresh working directories at the tenant
	// level get a file system of their own with a size and an inode
	// limit (Config.DiskQuotaBytes set and the node able to).
	DiskQuota bool
}

// Names lists the capabilities present: "namespaces", "netns", "egress",
// "landlock", "seccomp", "cgroup", "pids", "disk-quota".
func (c Capabilities) Names() []string {
	var out []string
	for _, n := range []struct {
		name string
		ok   bool
	}{
		{"namespaces", c.Namespaces}, {"netns", c.NetNS}, {"egress", c.Egress}, {"landlock", c.LandlockABI > 0},
		{"seccomp", c.Seccomp}, {"cgroup", c.Cgroup}, {"pids", c.Pids}, {"disk-quota", c.DiskQuota},
	} {
		if n.ok {
			out = append(out, n.name)
		}
	}
	return out
}

// identityEnv is the environment that describes the task's user at the
// tenant level, where the task runs under a leased UID named
// [TaskUserName]: HOME, USER, LOGNAME, and EMAIL as TaskUserName@hostname,
// which git takes for the author's address (without it git would build
// one from the host name, find no domain in it and refuse to commit). Nil
// at the process level, whose tasks keep the agent's identity and its
// HOME.
func (e *Executor) identityEnv(p *prepared) []EnvVar {
	if e.isolation != IsolationTenant || p.User == nil {
		return nil
	}
	return []EnvVar{
		{"HOME", TaskHome},
		{"USER", TaskUserName},
		{"LOGNAME", TaskUserName},
		{"EMAIL", TaskUserName + "@" + e.hostname},
	}
}

// defaultEnv is the base of a task's environment under the ambient part:
// at the tenant level PATH, since no variable of the agent's is inherited
// there by default ([AmbientAllowlist]); nothing at the process level,
// where the agent's scrubbed PATH passes.
func (e *Executor) defaultEnv() []EnvVar {
	if e.isolation != IsolationTenant {
		return nil
	}
	return []EnvVar{{"PATH", DefaultTaskPath}}
}

// LimitEphemeralStorage is the name, in Result.LimitsNotEnforced, of the
// working directory's disk quota (Config.DiskQuotaBytes) on a node that
// cannot enforce it; as in Kubernetes' resource names.
const LimitEphemeralStorage = "ephemeral-storage"
