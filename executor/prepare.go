package executor

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
)

// validName is what Spec.ID and Config.CgroupParent may look like: one path
// element, not "." or "..", safe in cgroupfs.
var validName = regexp.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9_.-]{0,199}$`)

// prepared is a Spec with defaults applied and checks passed.
type prepared struct {
	Spec
	env             []string
	ownWorkDir      bool   // WorkingDir was created for the task
	ownSpill        bool   // SpillDir was created for the task
	ownRoot         string // the task's private upper and work directories' parent (prepareRoot), "" for none
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
	if err := checkTerminal(p); err != nil {
		return nil, err
	}
	if err := e.prepareNetwork(p); err != nil {
		return nil, err
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
	managed := p.ManagedEnv
	if p.Workspace != nil {
		carried = p.Workspace.Env
		if b := p.Workspace.Workspace.trustBundle(); b != "" {
			managed = append(slices.Clip(managed), trustEnv(b)...)
		}
	}
	env, err := BuildEnv(EnvOptions{Mode: AmbientInherit, Defaults: e.defaultEnv(), Ambient: e.ambient, Identity: e.identityEnv(p),
		Carried: carried, Explicit: p.Env, Managed: managed, Terminal: p.Terminal != nil})
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
	if err := e.prepareRoot(p); err != nil {
		p.cleanupDirs()
		return nil, err
	}
	return p, nil
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

// prepareNetwork checks the spec's network against the isolation level and
// what the executor can give, and sets its canonical name.
func (e *Executor) prepareNetwork(p *prepared) error {
	network, err := ParseNetwork(string(p.Network))
	if err != nil {
		return startErr(ErrInvalidSpec, "", err)
	}
	if p.Network = network; network != NetworkNode && e.isolation != IsolationTenant {
		return startErr(ErrInvalidSpec, "network "+string(network)+" needs the tenant isolation level", nil)
	}
	if network == NetworkEgress && e.egress == nil {
		if e.egressErr != nil {
			// egressErr wraps ErrIsolation already: its text appears once.
			why := strings.TrimPrefix(e.egressErr.Error(), ErrIsolation.Error()+": ")
			return startErr(ErrIsolation, "network egress is not available: "+why, nil)
		}
		return startErr(ErrIsolation, "network egress is not available: this executor was not configured for it", nil)
	}
	if p.Egress != nil {
		if network != NetworkEgress || p.Workspace != nil {
			return startErr(ErrInvalidSpec, "an egress policy needs network Egress and no workspace (a workspace's tasks follow the workspace's)", nil)
		}
		if err := p.Egress.Validate(); err != nil {
			return startErr(ErrInvalidSpec, "", err)
		}
		if len(p.Egress.Inject) > 0 {
			return startErr(ErrInvalidSpec, "egress.inject needs a workspace: its tasks get the workspace's CA in their trust store", nil)
		}
	}
	return nil
}
