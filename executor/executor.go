package executor

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"time"
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
	// means AmbientScrub.
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
	shimPath   string
	shimWait   time.Duration // ShimReportTimeout
	tmpSize    int64
	taskProcs  int64
	noLandlock bool
	noSeccomp  bool
	caps       Capabilities
	pool       *shimPool // nil: every tenant task starts its own shim

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
		allow:    slices0(cfg.AmbientAllowlist),
		workRoot: cfg.WorkDirRoot,
		lease:    cfg.Lease,
	}
	if e.shell == "" {
		e.shell = DefaultShell
	}
	if !filepath.IsAbs(e.shell) {
		return nil, fmt.Errorf("%w: shell %q is not an absolute path", ErrInvalidConfig, e.shell)
	}
	mode, err := ParseAmbientMode(string(cfg.AmbientEnv))
	if err != nil {
		return nil, err
	}
	e.envMode = mode
	ambient := cfg.AmbientEnviron
	if ambient == nil {
		ambient = os.Environ()
	}
	// The ambient environment is fixed as of New, so the mode's filter
	// (an upper-casing scan of every name in scrub mode) runs once here
	// instead of in every Start.
	if e.ambient, err = filterAmbient(e.envMode, e.allow, ambient); err != nil {
		return nil, err
	}
	if e.workRoot == "" {
		e.workRoot = os.TempDir()
	}
	if err := e.configureIsolation(cfg); err != nil {
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

func (e *Executor) configureIsolation(cfg Config) error {
	level, err := ParseIsolation(string(cfg.Isolation))
	if err != nil {
		return err
	}
	e.isolation, e.shimPath, e.tmpSize, e.taskProcs = level, cfg.ShimPath, cfg.TmpSizeBytes, cfg.TaskProcs
	e.noLandlock, e.noSeccomp = cfg.NoLandlock, cfg.NoSeccomp
	e.mask = slices0(cfg.MaskPaths)
	for _, m := range e.mask {
		if !filepath.IsAbs(m) {
			return fmt.Errorf("%w: masked path %q is not absolute", ErrInvalidConfig, m)
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

func slices0(s []string) []string { return append([]string(nil), s...) }

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
	return slices0(e.cg.controllers)
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
	return errors.Join(errs...)
}

// validName is what Spec.ID and Config.CgroupParent may look like: one path
// element, not "." or "..", safe in cgroupfs.
var validName = regexp.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9_.-]{0,199}$`)

// prepared is a Spec with defaults applied and checks passed.
type prepared struct {
	Spec
	env             []string
	ownWorkDir      bool // WorkingDir was created for the task
	ownSpill        bool // SpillDir was created for the task
	spill           *spillDir
	quotaFS         *quotaFS // the working directory's own file system, nil without
	diskNotEnforced bool     // the executor wants a disk quota the node cannot give
}

// prepareWorkspace applies a workspace task's identity and network
// (Spec.Workspace) before the other checks see them.
func (e *Executor) prepareWorkspace(p *prepared) error {
	wt := p.Workspace
	if wt == nil {
		return nil
	}
	w := wt.Workspace
	switch {
	case e.isolation != IsolationTenant:
		return startErr(ErrInvalidSpec, "workspaces need the tenant isolation level", nil)
	case w == nil:
		return startErr(ErrInvalidSpec, "a workspace task names no workspace", nil)
	}
	p.Network, p.User, p.WorkingDir = w.network, &User{UID: w.uid, GID: w.gid}, ""
	p.Limits.DiskBytes = 0
	return nil
}

// prepare applies defaults and runs the pre-start checks in a fixed order:
// spec ranges, command, environment, shell, working directory, spill
// directory. It creates nothing on disk except the default working
// directory and, when the spec names none, a spill directory, and only
// after every check passed.
func (e *Executor) prepare(spec Spec) (*prepared, error) {
	p := &prepared{Spec: spec}
	if err := e.prepareWorkspace(p); err != nil {
		return nil, err
	}
	switch {
	case p.Timeout < 0, p.KillGrace < 0, p.TailBytes < 0, p.SpillLimitBytes < 0,
		p.Limits.MemoryBytes < 0, p.Limits.CPUMillis < 0, p.Limits.Pids < 0:
		return nil, startErr(ErrInvalidSpec, "negative duration, size or limit", nil)
	case p.TailBytes > MaxTailBytes:
		return nil, startErr(ErrInvalidSpec, fmt.Sprintf("tail of %d bytes is over %d", p.TailBytes, MaxTailBytes), nil)
	case p.ID != "" && !validName.MatchString(p.ID):
		return nil, startErr(ErrInvalidSpec, fmt.Sprintf("id %q is not a single path element", p.ID), nil)
	case p.WorkingDir != "" && !filepath.IsAbs(p.WorkingDir):
		return nil, startErr(ErrInvalidSpec, fmt.Sprintf("working directory %q is not absolute", p.WorkingDir), nil)
	}
	if err := checkStdinStream(p); err != nil {
		return nil, err
	}
	network, err := ParseNetwork(string(p.Network))
	if err != nil {
		return nil, startErr(ErrInvalidSpec, "", err)
	}
	if p.Network = network; network != NetworkNode && e.isolation != IsolationTenant {
		return nil, startErr(ErrInvalidSpec, "network "+string(network)+" needs the tenant isolation level", nil)
	}
	if network == NetworkEgress && e.egress == nil {
		if e.egressErr != nil {
			// egressErr wraps ErrIsolation already: its text appears once.
			why := strings.TrimPrefix(e.egressErr.Error(), ErrIsolation.Error()+": ")
			return nil, startErr(ErrIsolation, "network egress is not available: "+why, nil)
		}
		return nil, startErr(ErrIsolation, "network egress is not available: this executor was not configured for it", nil)
	}
	if p.KillGrace == 0 {
		p.KillGrace = DefaultKillGrace
	}
	if p.TailBytes == 0 {
		p.TailBytes = DefaultTailBytes
	}
	if p.SpillLimitBytes == 0 {
		p.SpillLimitBytes = DefaultSpillLimitBytes
	}

	if strings.IndexByte(p.Command, 0) >= 0 {
		return nil, startErr(ErrCommandNUL, "", nil)
	}
	if len(p.Command)+1 > MaxArgStrlen {
		return nil, startErr(ErrArgumentTooLong, fmt.Sprintf("command is %d bytes, limit %d", len(p.Command), MaxArgStrlen-1), nil)
	}
	var carried []EnvVar
	if p.Workspace != nil {
		carried = p.Workspace.Env
	}
	env, err := BuildEnv(EnvOptions{Mode: AmbientInherit, Ambient: e.ambient, Identity: e.identityEnv(p), Carried: carried, Explicit: p.Env, Managed: p.ManagedEnv})
	if err != nil {
		return nil, err
	}
	p.env = env
	// Each string fits, but execve also limits them all together: over
	// that it fails with E2BIG, which names nothing. Measured here, the
	// message gives the size, the limit and the largest entries.
	if argv, stack := []string{e.shell, "-c", p.Command}, stackLimit(); argEnvSize(e.shell, argv, env) > ArgEnvLimit(stack) {
		return nil, startErr(ErrArgumentTooLong, argEnvMessage(e.shell, argv, env, stack), nil)
	}
	if err := checkShell(e.shell); err != nil {
		return nil, err
	}
	switch {
	case p.Workspace != nil:
		// The shim resolves the start directory inside the workspace;
		// the working directory here is the workspace's root on the
		// node, the tree it clones.
		p.WorkingDir = p.Workspace.Workspace.dir
	case p.WorkingDir != "" && e.isolation == IsolationTenant:
		dir, err := e.tenantWorkDir(p.WorkingDir)
		if err != nil {
			return nil, err
		}
		p.WorkingDir = dir
	case p.WorkingDir != "":
		if _, err := statWorkDir(p.WorkingDir, p.WorkingDir); err != nil {
			return nil, err
		}
	}
	if err := p.setupSpillDir(); err != nil {
		return nil, err
	}
	if err := e.checkDiskLimit(p); err != nil {
		p.cleanupDirs()
		return nil, err
	}
	if p.WorkingDir == "" && p.Workspace == nil {
		if err := e.makeWorkDir(p); err != nil {
			p.cleanupDirs()
			return nil, err
		}
	}
	return p, nil
}

// setupSpillDir checks the spill directory, or makes a fresh one when the
// spec names none: 0700 so other users on the node (and other tasks, which
// run as other users) cannot read a task's output. A named directory that
// does not exist yet is created with the first byte of output (spillDir),
// so a task that prints nothing creates nothing.
func (p *prepared) setupSpillDir() error {
	if p.SpillDir == "" {
		dir, err := os.MkdirTemp("", "bashtask-spill-")
		if err != nil {
			return startErr(ErrSpillDir, os.TempDir(), err)
		}
		p.SpillDir, p.ownSpill = dir, true
		p.spill = &spillDir{path: dir, exists: true}
		return nil
	}
	p.spill = &spillDir{path: p.SpillDir}
	fi, err := os.Lstat(p.SpillDir)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return nil
	case err != nil:
		return startErr(ErrSpillDir, p.SpillDir, err)
	}
	if err := checkSpillDir(p.SpillDir, fi); err != nil {
		return err
	}
	p.spill.exists = true
	return nil
}

// checkSpillDir requires a directory (not a symlink to one) without group
// or other permission bits.
func checkSpillDir(path string, fi os.FileInfo) error {
	switch {
	case !fi.IsDir():
		return startErr(ErrSpillDir, path+" is not a directory", nil)
	case fi.Mode().Perm()&0o077 != 0:
		return startErr(ErrSpillDir, fmt.Sprintf("%s has mode %v, want no group or other access", path, fi.Mode().Perm()), nil)
	}
	return nil
}

// spillDir is a task's spill directory, shared by its two streams: the
// first of them to write creates it when it did not exist at Start.
type spillDir struct {
	path   string
	exists bool // checked or made by prepare

	once sync.Once
	err  error
}

// ensure creates the directory with mode 0700 if prepare found none. One
// that appeared since (another process raced to make it) is accepted only
// if it passes the same checks as at Start.
func (d *spillDir) ensure() error {
	d.once.Do(func() {
		if d.exists {
			return
		}
		err := os.Mkdir(d.path, 0o700)
		if errors.Is(err, os.ErrExist) {
			var fi os.FileInfo
			if fi, err = os.Lstat(d.path); err == nil {
				err = checkSpillDir(d.path, fi)
			}
		}
		d.err = err
	})
	return d.err
}

// statWorkDir checks that path, the working directory named as name in
// errors, exists and is a directory, with ErrWorkingDirMissing or
// ErrWorkingDirNotDir when not.
func statWorkDir(path, name string) (os.FileInfo, error) {
	fi, err := os.Stat(path)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return nil, startErr(ErrWorkingDirMissing, name, nil)
	case err != nil:
		return nil, startErr(ErrWorkingDirMissing, name, err)
	case !fi.IsDir():
		return nil, startErr(ErrWorkingDirNotDir, name, nil)
	}
	return fi, nil
}

// tenantSharedDirs are where a working directory named in the spec may
// not lie at IsolationTenant: the task's shim mounts a fresh /proc, a
// private /tmp and /dev/shm, and the node's /sys and /dev are the node's;
// the working directory is a writable clone of the node's directory
// placed over the task's view, so one there would show the task the
// node's instead (every process's command line in /proc, what other
// tenants left in /tmp). Fresh working directories, which the executor
// creates under its own root, are not named in the spec.
var tenantSharedDirs = []string{"/proc", "/sys", "/dev", "/tmp"}

// tenantWorkDir checks a working directory named in the spec against what
// IsolationTenant promises and returns it with symbolic links resolved,
// the path the shim then uses. It refuses the root directory, a directory
// in tenantSharedDirs or in a masked path or holding one, and a directory
// every user may write (shared between tenants); the error wraps
// ErrInvalidSpec and says which rule.
func (e *Executor) tenantWorkDir(wd string) (string, error) {
	refuse := func(why string) error {
		return startErr(ErrInvalidSpec, fmt.Sprintf("working directory %s %s; at the tenant isolation level leave spec.workingDir unset for a fresh private directory", wd, why), nil)
	}
	dir, err := filepath.EvalSymlinks(wd)
	if errors.Is(err, os.ErrNotExist) {
		return "", startErr(ErrWorkingDirMissing, wd, nil)
	}
	if err != nil {
		return "", startErr(ErrWorkingDirMissing, wd, err)
	}
	fi, err := statWorkDir(dir, wd)
	if err != nil {
		return "", err
	}
	within := func(path, dir string) bool { return path == dir || strings.HasPrefix(path, dir+"/") }
	if dir == "/" {
		return "", refuse("is the root directory, which would make the whole file system writable to the task")
	}
	for _, shared := range tenantSharedDirs {
		if within(dir, shared) {
			return "", refuse(fmt.Sprintf("lies in %s, which the task must see as its own, not the node's", shared))
		}
	}
	if e.wsDir != "" && (within(dir, e.wsDir) || within(e.wsDir, dir)) {
		return "", refuse("is or holds the workspaces' directory " + e.wsDir + ", which only workspace tasks see")
	}
	for _, m := range e.mask {
		if within(dir, m) || within(m, dir) {
			return "", refuse(fmt.Sprintf("is or holds %s, which the agent hides from tasks", m))
		}
	}
	if fi.Mode().Perm()&0o002 != 0 {
		return "", refuse("is writable by every user, so other tenants' tasks share it")
	}
	return dir, nil
}

// makeWorkDir creates a fresh working directory owned by the task's user:
// at IsolationTenant with a disk quota the root of a file system of its
// own (diskQuota), else a directory under the work root.
func (e *Executor) makeWorkDir(p *prepared) error {
	if e.quota != nil && e.isolation == IsolationTenant {
		fs, err := e.quota.take(p.Limits.DiskBytes)
		if err != nil {
			return startErr(ErrProcessStart, "making the working directory's file system", err)
		}
		p.WorkingDir, p.ownWorkDir, p.quotaFS = fs.dir, true, fs
		// mkfs makes the root 0755: 0700 as without a quota.
		if err := os.Chmod(fs.dir, 0o700); err != nil {
			return startErr(ErrProcessStart, "chmod working directory "+fs.dir, err)
		}
	} else {
		dir, err := os.MkdirTemp(e.workRoot, "bashtask-work-")
		if err != nil {
			return startErr(ErrWorkingDirMissing, e.workRoot, err)
		}
		p.WorkingDir, p.ownWorkDir = dir, true
	}
	if p.User != nil {
		if err := os.Chown(p.WorkingDir, int(p.User.UID), int(p.User.GID)); err != nil {
			return startErr(ErrProcessStart, "chown working directory "+p.WorkingDir, err)
		}
	}
	return nil
}

// checkDiskLimit refuses a disk size over the cap and notes a quota the
// node cannot give.
func (e *Executor) checkDiskLimit(p *prepared) error {
	if e.isolation != IsolationTenant || !e.quotaWanted {
		return nil
	}
	if p.Workspace != nil {
		// The workspace's own file system, sized when it was made.
		p.diskNotEnforced = !p.Workspace.Workspace.StorageEnforced()
		return nil
	}
	if d := p.Limits.DiskBytes; d > e.quotaCap {
		return startErr(ErrInvalidSpec, fmt.Sprintf("spec.resources.ephemeralStorage of %d bytes is over the agent's cap of %d bytes (--task-disk-cap)", d, e.quotaCap), nil)
	}
	if d := p.Limits.DiskBytes; d != 0 && d < MinDiskQuotaBytes {
		return startErr(ErrInvalidSpec, fmt.Sprintf("spec.resources.ephemeralStorage of %d bytes is below the smallest working directory file system, %d bytes", d, MinDiskQuotaBytes), nil)
	}
	p.diskNotEnforced = e.quota == nil && p.WorkingDir == ""
	return nil
}

// removeWorkDir removes the task's fresh working directory: a file system
// of its own is closed to the task's UID at once and unmounted, its image
// deleted, in the background (quotaFS.retire), without walking the task's
// files; a plain directory is removed with os.RemoveAll, which opens each
// level relative to the last and does not follow symbolic links.
func (p *prepared) removeWorkDir() error {
	if p.quotaFS != nil {
		return p.quotaFS.retire()
	}
	return os.RemoveAll(p.WorkingDir)
}

// cleanupDirs removes what prepare created when the task cannot start.
func (p *prepared) cleanupDirs() {
	if p.ownWorkDir {
		_ = p.removeWorkDir()
	}
	if p.ownSpill {
		os.RemoveAll(p.SpillDir)
	}
}

// checkShell requires an executable regular file: execve would otherwise
// fail only in the child, with an error that names the shell rather than
// what the user got wrong.
func checkShell(shell string) error {
	fi, err := os.Stat(shell)
	if err != nil {
		return startErr(ErrShellMissing, shell, err)
	}
	if !fi.Mode().IsRegular() || fi.Mode().Perm()&0o111 == 0 {
		return startErr(ErrShellMissing, shell+" is not an executable file", nil)
	}
	return nil
}

// Start runs the pre-start checks, creates the spill files and starts the
// shell; it returns once the shell exists. The error is a [*StartError]
// (reason StartFailed) and nothing of the command ran. The returned Task
// ends on its own; Cancel stops it early.
func (e *Executor) Start(spec Spec) (*Task, error) {
	p, err := e.prepare(spec)
	if err != nil {
		return nil, err
	}
	t, err := e.start(p)
	if err != nil {
		p.cleanupDirs()
		return nil, err
	}
	return t, nil
}

// Task is a running or finished task.
type Task struct {
	spec   *prepared
	exec   *Executor
	stdout *stream
	stderr *stream

	cancelOnce sync.Once
	cancel     chan struct{}
	done       chan struct{}
	result     Result // written once before done is closed

	stdin *stdinFeeder // nil unless Spec.StdinStream

	sys taskSys // platform part
}

// Cancel asks the task to stop (SIGTERM, grace, SIGKILL). A task whose
// shell already exited is not affected: its reason stays what it was.
// Cancel is idempotent and does not wait; use Wait or Done.
func (t *Task) Cancel() {
	t.cancelOnce.Do(func() { close(t.cancel) })
}

// Done is closed when the task is over: every process stopped, all output
// read, the cgroup removed.
func (t *Task) Done() <-chan struct{} { return t.done }

// Wait blocks until the task is over and returns its Result, or returns
// ctx's error if ctx ends first (the task keeps running).
func (t *Task) Wait(ctx context.Context) (Result, error) {
	select {
	case <-t.done:
		return t.result, nil
	case <-ctx.Done():
		return Result{}, ctx.Err()
	}
}

// Result returns the task's Result and true once the task is over, a zero
// Result and false before.
func (t *Task) Result() (Result, bool) {
	select {
	case <-t.done:
		return t.result, true
	default:
		return Result{}, false
	}
}

// Snapshot returns the output so far; it may be called at any time, also
// after the task ended.
func (t *Task) Snapshot() Snapshot {
	return Snapshot{Stdout: t.stdout.snapshot(), Stderr: t.stderr.snapshot()}
}

// OutputState is one stream's progress as a reader of its spill file sees
// it (Task.Output).
type OutputState struct {
	// SpillPath is the spill file; it exists once the stream's first byte
	// was written.
	SpillPath string
	// SpillBytes is how many bytes the spill file holds and a reader may
	// read now: the stream's first bytes, at most SpillLimitBytes.
	SpillBytes int64
	// TotalBytes is how many bytes the command wrote to the stream so far.
	TotalBytes int64
	// SpillLimitBytes is the cap on the spill file ([Spec.SpillLimitBytes]).
	SpillLimitBytes int64
	// SpillFailed is true when writing the spill file failed: it stops at
	// SpillBytes although the stream may go on.
	SpillFailed bool
	// Ended is true once the stream was read to its end: TotalBytes and
	// SpillBytes are final.
	Ended bool
}

// Output returns stdout's (stderr false) or stderr's state and a channel
// closed at the stream's next change (bytes appended or the stream's end),
// nil once it has ended. A follower waits on the channel instead of polling
// the file; the writer pays one check per chunk while nobody waits.
func (t *Task) Output(stderr bool) (OutputState, <-chan struct{}) {
	if stderr {
		return t.stderr.output()
	}
	return t.stdout.output()
}

// SpillDir is the directory holding the task's spill files.
func (t *Task) SpillDir() string { return t.spec.SpillDir }

// WorkingDir is the directory the shell started in: [Spec.WorkingDir], or
// when that was empty the fresh directory the executor created under
// [Config.WorkDirRoot] and removes when the task ends.
func (t *Task) WorkingDir() string { return t.spec.WorkingDir }
