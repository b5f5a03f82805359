package executor

import (
	"cmp"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/bashtask/bashtask-operator/executor/shim"
)

// CgroupMode says whether the executor uses cgroup v2.
type CgroupMode string

const (
	// CgroupAuto uses a writable cgroup v2 hierarchy when one is found and
	// falls back to process groups otherwise. The zero value means this.
	CgroupAuto CgroupMode = "auto"
	// CgroupOff never uses cgroups: process groups only.
	CgroupOff CgroupMode = "off"
	// CgroupRequired makes [New] fail with ErrNoCgroupV2 when no writable
	// cgroup v2 hierarchy is found.
	CgroupRequired CgroupMode = "required"
)

// DefaultCgroupParent is the name of the cgroup, under the detected root,
// that holds the per-task cgroups.
const DefaultCgroupParent = "bashtask"

// Config is the executor's node-level configuration (agent flags).
type Config struct {
	// Shell is the absolute path of the shell run as `<Shell> -c
	// <command>`; never looked up in PATH. Empty means DefaultShell.
	Shell string
	// AmbientEnv selects which part of AmbientEnviron reaches tasks; empty
	// means the level's default: AmbientAllowlist at the tenant level,
	// AmbientScrub at the process level.
	AmbientEnv AmbientMode
	// AmbientAllowlist names the variables passed in AmbientAllowlist mode.
	AmbientAllowlist []string
	// AmbientEnviron is the agent environment tasks start from, as
	// NAME=VALUE strings; nil means os.Environ() as of New.
	AmbientEnviron []string
	// Cgroups selects the cgroup mode; empty means CgroupAuto.
	Cgroups CgroupMode
	// CgroupRoot is the cgroup v2 directory under which CgroupParent is
	// created. Empty means detected: the process's own cgroup in the first
	// writable cgroup2 mount of /proc/self/mountinfo (/sys/fs/cgroup in a
	// pod, /sys/fs/cgroup/unified on a hybrid host).
	CgroupRoot string
	// CgroupParent is the name of the parent cgroup of all tasks, a single
	// path element; empty means DefaultCgroupParent. It is created if
	// missing; the controllers it offers (memory, cpu, pids) are enabled for
	// its children when the node delegates them.
	CgroupParent string
	// WorkDirRoot is where fresh per-task working directories are created
	// when Spec.WorkingDir is empty; empty means os.TempDir().
	WorkDirRoot string
	// Isolation is the isolation level; empty means IsolationProcess.
	Isolation Isolation
	// ShimPath is the binary started in shim mode at IsolationTenant; empty
	// means DefaultShimPath. It must call shim.Main first thing.
	ShimPath string
	// TmpSizeBytes caps each task's private /tmp and /dev/shm at
	// IsolationTenant, in bytes; 0 means DefaultTmpSizeBytes.
	TmpSizeBytes int64
	// TaskProcs is the process limit (processes and threads) of a task at
	// IsolationTenant whose Spec sets no Limits.Pids: pids.max where task
	// cgroups have the pids controller, RLIMIT_NPROC on the task's UID
	// otherwise. 0 means DefaultTaskProcs; negative means no limit.
	TaskProcs int64
	// Hostname is the host name of tasks at IsolationTenant (their own UTS
	// namespace); empty means DefaultHostname. At most 64 bytes, which the
	// kernel checks when the shim sets it.
	Hostname string
	// MaskPaths are absolute paths hidden from tasks at IsolationTenant:
	// an empty read-only directory over a directory, /dev/null over a file
	// (the agent's state directory, TLS and credential files).
	MaskPaths []string
	// RunPaths are the node's paths under /run that tasks at
	// IsolationTenant reach, bound read-only into their own /run (the
	// sockets of node daemons tasks need; none by default): each clean,
	// absolute and below /run (shim.CheckRunPath).
	RunPaths []string
	// NoLandlock skips Landlock at IsolationTenant.
	NoLandlock bool
	// NoSeccomp skips the seccomp filter at IsolationTenant.
	NoSeccomp bool
	// ShimPoolSize is how many task shims IsolationTenant keeps started
	// ahead of tasks, per network a task has asked for, so that a start
	// does not wait for the shim's exec and runtime start; 0 means
	// DefaultShimPoolSize, negative means none (every task starts its own).
	ShimPoolSize int
	// DiskQuotaBytes is the size of the file system each fresh working
	// directory gets at IsolationTenant, in bytes (at least
	// MinDiskQuotaBytes): writes past it fail with ENOSPC in that task
	// only. 0 means no quota. Where the node cannot (no loop devices or
	// mkfs.ext4), New does not fail: Capabilities().DiskQuota is false
	// and every task's Result.LimitsNotEnforced names
	// "ephemeral-storage".
	DiskQuotaBytes int64
	// DiskQuotaCapBytes is the largest Limits.DiskBytes a task may ask
	// for, in bytes; 0 means DiskQuotaBytes.
	DiskQuotaCapBytes int64
	// DiskQuotaInodes is the inode limit of each working directory (files,
	// directories, links); 0 means DefaultDiskQuotaInodes. A file system
	// has at most one inode per 4 KiB block.
	DiskQuotaInodes int64
	// DiskImageDir is where the working directories' file system images
	// live, a directory of the executor's alone (the agent's state
	// directory): New removes every image it finds there and unmounts
	// what was mounted from them. Required with DiskQuotaBytes.
	DiskImageDir string
	// loopControl replaces /dev/loop-control in tests of a node without
	// loop devices.
	loopControl string
	// mkfs replaces mkfs.ext4 in tests that count its runs.
	mkfs string
	// ShimReportTimeout bounds each wait for one of a shim's first
	// reports at IsolationTenant: "ready" after its start, then the
	// shell's start or a failed step after its Config. A shim that stays
	// silent longer is killed and the start fails naming it; 0 means
	// DefaultShimReportTimeout.
	ShimReportTimeout time.Duration
	// WorkspaceDir is the directory the roots of workspaces
	// ([Executor.OpenWorkspace]) are mounted in at IsolationTenant, one
	// subdirectory each; empty means "workspaces" under WorkDirRoot. New
	// makes it a private mount of its own, which every task's shim
	// detaches from its mount namespace when it starts: a mount namespace
	// made later holds no copy of a workspace's file system, so that
	// deleting one never waits for unrelated tasks to end.
	WorkspaceDir string
	// Lease fences the tasks of workspaces at IsolationTenant: each such
	// task's shim stops it when the lease has not been renewed for its
	// window ([Lease]); nil fences nothing.
	Lease *Lease
	// Egress configures NetworkEgress at IsolationTenant; nil offers no
	// NetworkEgress. Its setup (an nftables table, IPv4 forwarding, the
	// tasks' resolv.conf) runs in New; where it fails (no nf_tables, no
	// CAP_NET_ADMIN) New still succeeds, Capabilities().Egress is false,
	// EgressError says why and a task asking for NetworkEgress fails to
	// start with ErrIsolation naming that reason: never another network
	// in its place.
	Egress *EgressConfig
}

// Executor runs tasks with one configuration. It is safe for concurrent
// use.
type Executor struct {
	shell    string
	envMode  AmbientMode
	allow    []string
	ambient  []string // the agent's environment passed through envMode's filter
	workRoot string
	cg       *cgroupParent // nil: process groups only

	isolation  Isolation
	hostname   string
	mask       []string
	runPaths   []string // RunPaths
	shimPath   string
	shimWait   time.Duration // ShimReportTimeout
	tmpSize    int64
	taskProcs  int64
	noLandlock bool
	noSeccomp  bool
	// seccompFilter is the tenant level's seccomp filter as shim.EncodeFilter
	// encodes it, assembled once by detectCapabilities; nil with noSeccomp.
	seccompFilter []byte
	caps          Capabilities
	pool          *shimPool // nil: every tenant task starts its own shim
	idmaps        idmaps    // the user namespaces of image roots' idmapped layers

	quota       *diskQuota // nil: no disk quota
	quotaWanted bool       // Config.DiskQuotaBytes set; with quota nil the node cannot
	quotaCap    int64      // Config.DiskQuotaCapBytes
	quotaReason string     // why the node cannot, when quotaWanted and quota is nil
	egress      *egress    // nil: no NetworkEgress
	egressErr   error      // why egress is nil although Config.Egress was set
	wsDir       string     // Config.WorkspaceDir, a private mount; "" but at IsolationTenant
	lease       *Lease     // Config.Lease
}

// cgroupParent is the parent cgroup of the executor's tasks.
type cgroupParent struct {
	path        string
	created     bool     // New created it, so Close removes it
	controllers []string // enabled for task cgroups (cgroup.subtree_control)
}

// New validates cfg, checks the shell, sets up the parent cgroup and
// detects the node's [Capabilities] (at IsolationTenant by running a probe
// task through the shim). It returns an error wrapping ErrInvalidConfig, a
// [*StartError] with ErrShellMissing (a node with a missing shell must
// report not ready), ErrNoCgroupV2 when cfg.Cgroups is CgroupRequired and
// no writable cgroup v2 is found, or one wrapping ErrIsolation when the
// tenant level cannot be applied here (the message says what failed).
func New(cfg Config) (*Executor, error) {
	e := &Executor{
		shell:    cfg.Shell,
		allow:    slices.Clone(cfg.AmbientAllowlist),
		workRoot: cfg.WorkDirRoot,
		lease:    cfg.Lease,
	}
	if e.shell == "" {
		e.shell = DefaultShell
	}
	if !filepath.IsAbs(e.shell) {
		return nil, fmt.Errorf("%w: shell %q is not an absolute path", ErrInvalidConfig, e.shell)
	}
	if e.workRoot == "" {
		e.workRoot = os.TempDir()
	}
	if err := e.configureIsolation(cfg); err != nil {
		return nil, err
	}
	if err := e.configureAmbient(cfg); err != nil {
		return nil, err
	}
	if err := checkShell(e.shell); err != nil {
		return nil, err
	}
	parent := cfg.CgroupParent
	if parent == "" {
		parent = DefaultCgroupParent
	}
	if !validName.MatchString(parent) {
		return nil, fmt.Errorf("%w: cgroup parent %q is not a single path element", ErrInvalidConfig, parent)
	}
	switch cfg.Cgroups {
	case "", CgroupAuto, CgroupRequired:
		cg, err := setupCgroupParent(cfg.CgroupRoot, parent)
		if err != nil {
			if cfg.Cgroups == CgroupRequired {
				return nil, err
			}
			// Auto: process groups only; the Result of every task says so.
			break
		}
		e.cg = cg
	case CgroupOff:
	default:
		return nil, fmt.Errorf("%w: cgroup mode %q", ErrInvalidConfig, cfg.Cgroups)
	}
	if e.isolation == IsolationTenant && e.cg != nil {
		if err := sweepPoolCgroups(e.cg.path); err != nil {
			_ = e.Close()
			return nil, fmt.Errorf("removing the cgroups of an earlier executor's shims: %w", err)
		}
	}
	if err := e.setupDiskQuota(cfg); err != nil {
		_ = e.Close()
		return nil, err
	}
	if err := e.setupWorkspaceDir(cfg); err != nil {
		_ = e.Close()
		return nil, err
	}
	if cfg.Egress != nil {
		if e.isolation != IsolationTenant {
			_ = e.Close()
			return nil, fmt.Errorf("%w: network egress needs the tenant isolation level", ErrInvalidConfig)
		}
		plan, err := planEgress(*cfg.Egress)
		if err != nil {
			_ = e.Close()
			return nil, err
		}
		e.egress, e.egressErr = newEgress(plan)
	}
	if err := e.detectCapabilities(); err != nil {
		_ = e.Close()
		return nil, err
	}
	e.caps.DiskQuota = e.quota != nil
	if size := cmp.Or(cfg.ShimPoolSize, DefaultShimPoolSize); e.isolation == IsolationTenant && size > 0 {
		e.pool = newShimPool(e, size)
	}
	return e, nil
}

// configureAmbient fixes the part of the agent's environment tasks get,
// once: the mode (the level's default when cfg leaves it empty) and its
// filter over the environment as of New, so that the filter's scan runs
// here and not in every Start.
func (e *Executor) configureAmbient(cfg Config) error {
	mode, err := ParseAmbientMode(string(cfg.AmbientEnv))
	if err != nil {
		return err
	}
	if mode == "" {
		mode = DefaultAmbientMode(e.isolation)
	}
	e.envMode = mode
	ambient := cfg.AmbientEnviron
	if ambient == nil {
		ambient = os.Environ()
	}
	e.ambient, err = filterAmbient(e.envMode, e.allow, ambient)
	return err
}

func (e *Executor) configureIsolation(cfg Config) error {
	level, err := ParseIsolation(string(cfg.Isolation))
	if err != nil {
		return err
	}
	e.isolation, e.shimPath, e.tmpSize, e.taskProcs = level, cfg.ShimPath, cfg.TmpSizeBytes, cfg.TaskProcs
	e.noLandlock, e.noSeccomp = cfg.NoLandlock, cfg.NoSeccomp
	e.mask = slices.Clone(cfg.MaskPaths)
	for _, m := range e.mask {
		if !filepath.IsAbs(m) {
			return fmt.Errorf("%w: masked path %q is not absolute", ErrInvalidConfig, m)
		}
	}
	e.runPaths = slices.Clone(cfg.RunPaths)
	for _, p := range e.runPaths {
		if err := shim.CheckRunPath(p); err != nil {
			return fmt.Errorf("%w: %w", ErrInvalidConfig, err)
		}
	}
	if e.shimPath == "" {
		e.shimPath = DefaultShimPath
	}
	if e.shimWait = cfg.ShimReportTimeout; e.shimWait <= 0 {
		e.shimWait = DefaultShimReportTimeout
	}
	if e.hostname = cfg.Hostname; e.hostname == "" {
		e.hostname = DefaultHostname
	}
	if e.tmpSize == 0 {
		e.tmpSize = DefaultTmpSizeBytes
	}
	if e.taskProcs == 0 {
		e.taskProcs = DefaultTaskProcs
	}
	if e.tmpSize < 0 {
		return fmt.Errorf("%w: tmp size %d is negative", ErrInvalidConfig, e.tmpSize)
	}
	return nil
}

// Capabilities is what the node allows for task isolation, as detected by
// New.
func (e *Executor) Capabilities() Capabilities { return e.caps }

// EgressError says why NetworkEgress is not offered although
// Config.Egress was set (its setup failed: the error wraps ErrIsolation);
// nil when it is offered or was not asked for.
func (e *Executor) EgressError() error { return e.egressErr }

func removeAll(dir string) error { return os.RemoveAll(dir) }

// Isolation is the executor's isolation level.
func (e *Executor) Isolation() Isolation { return e.isolation }

// ShimPath is the binary started as each task's shim at IsolationTenant
// (Config.ShimPath, or DefaultShimPath); empty at the other levels.
func (e *Executor) ShimPath() string {
	if e.isolation != IsolationTenant {
		return ""
	}
	return e.shimPath
}

// Mechanism says how tasks of this executor are held: MechanismCgroup when
// a writable cgroup v2 parent was set up, MechanismProcessGroup otherwise.
func (e *Executor) Mechanism() Mechanism {
	if e.cg != nil {
		return MechanismCgroup
	}
	return MechanismProcessGroup
}

// CgroupPath is the absolute path of the parent cgroup directory of the
// executor's tasks, empty without cgroups.
func (e *Executor) CgroupPath() string {
	if e.cg == nil {
		return ""
	}
	return e.cg.path
}

// Controllers lists the cgroup controllers enabled for task cgroups
// ("cpu", "memory", "pids", ...); a limit whose controller is missing is
// reported in Result.LimitsNotEnforced instead of being applied.
func (e *Executor) Controllers() []string {
	if e.cg == nil {
		return nil
	}
	return slices.Clone(e.cg.controllers)
}

// DiskCap is the largest Limits.DiskBytes the executor accepts, in bytes
// (Config.DiskQuotaCapBytes); 0 when fresh working directories get no
// quota (none configured, or the node cannot).
func (e *Executor) DiskCap() int64 {
	if e.quota == nil {
		return 0
	}
	return e.quotaCap
}

// DiskQuotaProblem says why fresh working directories get no disk quota
// although Config.DiskQuotaBytes asked for one (no loop devices, no
// mkfs.ext4); empty when they get it or none was asked for.
func (e *Executor) DiskQuotaProblem() string { return e.quotaReason }

// AmbientMode is the ambient environment mode in effect (for the agent's
// readiness info: AmbientInherit must be visible to the controller).
func (e *Executor) AmbientMode() AmbientMode { return e.envMode }

// Close kills the shims started ahead of tasks and removes the parent
// cgroup if New created it and it is empty. It does not stop running
// tasks.
func (e *Executor) Close() error {
	if e.pool != nil {
		e.pool.close()
	}
	if e.quota != nil {
		e.quota.close()
	}
	var errs []error
	if e.egress != nil {
		errs = append(errs, e.egress.close())
		e.egress = nil
	}
	if e.cg != nil && e.cg.created {
		errs = append(errs, removeCgroup(e.cg.path))
	}
	errs = append(errs, e.closeWorkspaceDir())
	e.idmaps.close()
	return errors.Join(errs...)
}
