//go:build linux

package executor

import (
	"bufio"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"time"

	"golang.org/x/sys/unix"

	"github.com/bashtask/bashtask-operator/executor/shim"
	"github.com/bashtask/bashtask-operator/internal/procfs"
)

// tenantSys is the part of a task that only the tenant level has: the
// shim (PID 1 of the task's PID namespace) is the process the executor
// started, and the shell is its child.
type tenantSys struct {
	shimDone chan struct{}  // closed once the shim was reaped
	pidNS    string         // the task's PID namespace, readlink /proc/<shim>/ns/pid
	startDir *shim.StartDir // a workspace task's start directory ("workdir" report)
	carry    *shim.Carry    // a workspace task's carry record, written before the shell's status is sent
	window   time.Duration  // a fenced task's lease window, 0 for none
	fenced   bool           // the shim stopped the task for its lease ("fenced" report), set before the shell's status is sent
}

// gone reports whether the shim was reaped.
func (ts *tenantSys) gone() bool {
	select {
	case <-ts.shimDone:
		return true
	default:
		return false
	}
}

// shimLaunch is what a task's shim is given: its Config, and the
// isolation the task gets from it.
type shimLaunch struct {
	cfg    shim.Config
	iso    IsolationResult
	tree   string // the node path the work tree is cloned from (cfg.WorkDir but for a workspace)
	netns  int    // a workspace's network namespace to pass, -1 for none
	userns int    // the image layers' idmap (shim.RootConfig.IDMapped) to pass, -1 for none
	shimNS Network
	// termSock is the config socket kept, its writing side shut down,
	// to receive a terminal's master on (shim.TerminalConfig); nil for a
	// task without a terminal.
	termSock *os.File
	// master is the terminal's master once received.
	master *os.File
	// lease fences a workspace task (window > 0): the shim stops the task
	// when it had no renewal for window (see [Lease]).
	lease  *Lease
	window time.Duration
}

// newShimLaunch prepares the shim Config of p. cgroupPids says whether the
// task's cgroup enforces the process limit (pids.max), so the shim need
// not set RLIMIT_NPROC.
func (e *Executor) newShimLaunch(p *prepared, cgroupPids bool) *shimLaunch {
	l := &shimLaunch{
		cfg: shim.Config{
			Shell:         e.shell,
			Command:       p.Command,
			Env:           p.env,
			WorkDir:       p.WorkingDir,
			WorkTree:      true,
			NullStdin:     !p.stdinPipe(),
			TmpSizeBytes:  e.tmpSize,
			Hostname:      e.hostname,
			Mask:          e.mask,
			RunPaths:      e.runPaths,
			Landlock:      !e.noLandlock,
			SeccompFilter: e.seccompFilter,
		},
		iso: IsolationResult{
			Level:      IsolationTenant,
			Namespaces: []string{"mnt", "pid", "ipc", "uts"},
			Network:    p.Network,
			Seccomp:    len(e.seccompFilter) > 0,
		},
		tree:   p.WorkingDir,
		netns:  -1,
		userns: -1,
		shimNS: p.Network,
	}
	if t := p.Terminal; t != nil {
		l.cfg.Terminal = &shim.TerminalConfig{Rows: t.Size.Rows, Cols: t.Size.Cols}
	}
	if !e.noLandlock {
		l.iso.LandlockABI = min(shim.LandlockABI(), 6)
	}
	switch p.Network {
	case NetworkNone:
		l.cfg.Loopback = true
		l.iso.Namespaces = append(l.iso.Namespaces, "net")
	case NetworkEgress:
		// The veth pair was set up by the executor (egress.attach) when
		// the shim started; the shim brings lo up and binds the resolvers.
		l.cfg.Loopback = true
		l.cfg.ResolvConf = e.egress.resolvPath
		l.iso.Namespaces = append(l.iso.Namespaces, "net")
	}
	if u := p.User; u != nil {
		uid, gid := u.UID, u.GID
		l.cfg.UID, l.cfg.GID = &uid, &gid
		l.cfg.User = &shim.UserEntry{Name: TaskUserName, Gecos: TaskUserGecos, Home: TaskHome, PrivateHome: true}
		l.iso.UID = &uid
	}
	if r := p.Root; r != nil {
		l.cfg.Root = &shim.RootConfig{Image: r.Image, LowerDirs: r.LowerDirs, UpperDir: r.UpperDir, WorkDir: r.WorkDir, RootInside: r.RootInside}
	}
	if p.Workspace != nil {
		l.workspace(p)
		if w := e.lease.Window(); w > 0 {
			l.lease, l.window, l.cfg.LeaseMillis = e.lease, w, w.Milliseconds()
		}
	}
	switch {
	case p.Limits.Pids > 0 && cgroupPids:
		l.iso.PidsLimit, l.iso.Procs = PidsLimitCgroup, p.Limits.Pids
	case p.User != nil && (p.Limits.Pids > 0 || e.taskProcs > 0):
		// Counted per real UID by the kernel: a per-task limit only
		// because the UID is the task's own. The spec's limit where it
		// sets one, the agent's default otherwise.
		procs := cmp.Or(p.Limits.Pids, e.taskProcs)
		l.cfg.NProc = uint64(procs)
		l.iso.PidsLimit, l.iso.Procs = PidsLimitRlimit, procs
	}
	return l
}

// workspace turns l into the launch of a workspace task: the
// workspace's tree at WorkspaceHome (HOME, no private home), its network
// namespace joined by a shim started without one of its own, and the
// start directory and carry-over of p.Workspace.
func (l *shimLaunch) workspace(p *prepared) {
	wt := p.Workspace
	l.cfg.WorkDir = WorkspaceHome
	l.cfg.User.Home, l.cfg.User.PrivateHome = WorkspaceHome, false
	l.cfg.Workspace = &shim.WorkspaceConfig{
		StartDir:         WorkspaceDirIn(wt.Dir),
		StartDirRequired: wt.DirRequired,
		Carry:            wt.Carry || wt.CarryEnv,
		CarryEnv:         wt.CarryEnv,
	}
	// A shim of the pool without a network namespace of its own, which
	// joins the workspace's: no namespace is made on the start's path.
	l.shimNS, l.cfg.Loopback = NetworkNode, false
	if fd, err := wt.Workspace.netnsFD(); err == nil && fd >= 0 {
		l.netns, l.cfg.NetNS = fd, true
	}
	if rc := wt.Workspace.resolvConf(); rc != "" {
		l.cfg.ResolvConf = rc
	}
	if b := wt.Workspace.trustBundle(); b != "" {
		l.cfg.RunPaths = append(slices.Clip(l.cfg.RunPaths), b)
	}
}

// startTenant starts t at the tenant level: it takes a shim started ahead
// of time, in a cgroup of its own, from the pool and limits that cgroup,
// or creates the task's cgroup and starts a shim in it; then it hands the
// shim the Config and waits for the shell's start. On failure nothing of the
// command ran and the shim is gone.
func (e *Executor) startTenant(t *Task) error {
	s, p := &t.sys, t.spec
	l := e.newShimLaunch(p, e.caps.Pids)
	s.iso = l.iso
	var sp *shimProc
	if p.Workspace != nil {
		if _, err := p.Workspace.Workspace.netnsFD(); err != nil {
			return startErr(ErrInvalidSpec, "", err)
		}
		if l.window > 0 && !l.lease.Held(l.window) {
			return startErr(ErrLeaseExpired, fmt.Sprintf("no controller watched this agent within the last %v; the workspace may run on another node now", l.window), nil)
		}
	}
	if l.cfg.Root != nil && l.cfg.UID != nil {
		// The image's root-owned files become the task's (docs/images.md).
		fd, err := e.idmaps.get(e.shimPath, *l.cfg.UID, *l.cfg.GID)
		if err != nil {
			return startErr(ErrIsolation, "", err)
		}
		l.userns, l.cfg.Root.IDMapped = fd, true
	}
	if e.pool != nil {
		sp = e.pool.take(l.shimNS)
	}
	if sp != nil {
		s.pooledShim = true
		// The pooled shim is in a cgroup of its own already (created with
		// it, CLONE_INTO_CGROUP): the task's cgroup from now on.
		s.cg, sp.cg = sp.cg, nil
		var err error
		if s.cg == nil {
			s.notEnforced = requestedLimits(p.Limits)
		} else if s.notEnforced, err = e.cg.limit(s.cg, p.Limits); err != nil {
			sp.discard()
			return startErr(ErrProcessStart, "", err)
		}
	} else {
		if err := e.createTaskCgroup(t); err != nil {
			return err
		}
		var err error
		if sp, err = e.startShim(l.shimNS, s.cg); err != nil {
			return startErr(ErrProcessStart, "starting the shim "+e.shimPath, err)
		}
		// Its ready report before its Config, as for a pooled shim: a
		// shim of another build is never handed a Config it might read
		// differently.
		if err := sp.awaitReady(); err != nil {
			return startErr(ErrIsolation, "", err)
		}
	}
	s.notEnforced = p.withDiskNotEnforced(s.notEnforced)
	if l.iso.PidsLimit == PidsLimitRlimit {
		// The spec's pids limit holds, through RLIMIT_NPROC.
		s.notEnforced = slices.DeleteFunc(s.notEnforced, func(c string) bool { return c == "pids" })
	}
	if !p.stdinPipe() {
		// The shim gives the shell /dev/null (Config.NullStdin).
		sp.stdinW.Close()
		sp.stdinW = nil
	}
	if p.Egress != nil && sp.net != nil {
		g, err := e.egress.guard(sp.net, *p.Egress, p.EgressRefused)
		if err != nil {
			sp.discard()
			return startErr(ErrIsolation, "the task's egress policy", err)
		}
		s.guard, l.cfg.ResolvConf = g, g.resolvPath
	}
	exitCh, ts, err := l.handshake(sp)
	if err != nil {
		if s.guard != nil {
			s.guard.close()
			s.guard = nil
		}
		return err
	}
	s.net, sp.net = sp.net, nil
	s.startTime = time.Now()
	s.proc, s.pid, s.startTicks, s.exitCh, s.tenant = sp.proc, sp.proc.Pid, sp.startTicks, exitCh, ts
	s.stdinW, s.stdoutR, s.stderrR = sp.stdinW, sp.stdoutR, sp.stderrR
	if l.master != nil {
		// The shim's stdout carries nothing: the terminal does.
		s.stdoutR.Close()
		s.stdoutR = l.master
	}
	return nil
}

// handshake sends the Config to sp, which has reported ready, and reads its
// next report: the shell started, or the step that failed. On failure the
// shim is discarded and the error is a [*StartError] with ErrIsolation
// naming the step. On success it returns the channel that receives the
// shell's exit status (the shim's own if it died without reporting one)
// and the shim's state.
func (l *shimLaunch) handshake(sp *shimProc) (_ <-chan exitStatus, _ *tenantSys, err error) {
	// What the handshake holds until it hands it on: the tree and the
	// lease pipe's read end go to the shim with the Config, the write end
	// to the lease once the shell started. One cleanup for every failure:
	// what is still held, then the shim.
	tree := -1
	var leaseR, leaseW *os.File
	defer func() {
		if err == nil {
			return
		}
		if tree >= 0 {
			unix.Close(tree)
		}
		if leaseR != nil {
			leaseR.Close()
		}
		if l.termSock != nil {
			l.termSock.Close()
		}
		sp.discard()
		if leaseW != nil {
			leaseW.Close()
		}
	}()
	data, err := json.Marshal(l.cfg)
	if err != nil {
		return nil, nil, err
	}
	// The working directory as this process sees it now, a detached
	// clone of its mounts: a shim started ahead of its task has a copy of
	// the mounts of its start, without the working directory's own file
	// system (diskQuota) mounted since.
	fd, err := unix.OpenTree(unix.AT_FDCWD, l.tree, unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC|unix.AT_RECURSIVE)
	if err != nil {
		return nil, nil, startErr(ErrIsolation, "", fmt.Errorf("cloning working directory %s: %w", l.tree, err))
	}
	tree = fd
	if l.window > 0 {
		// The lease pipe: the shim reads renewals from its end, the
		// lease writes them to this one until the shim is reaped.
		if leaseR, leaseW, err = os.Pipe(); err != nil {
			return nil, nil, startErr(ErrIsolation, "", fmt.Errorf("the lease pipe: %w", err))
		}
	}
	l.sendConfig(sp, data, tree, leaseR)
	tree, leaseR = -1, nil // sendConfig closes them
	startDir, err := l.awaitStart(sp)
	if err != nil {
		return nil, nil, err
	}
	if l.termSock != nil {
		sock := l.termSock
		l.termSock = nil
		if l.master, err = receiveMaster(sock); err != nil {
			return nil, nil, startErr(ErrIsolation, "", err)
		}
	}
	if leaseW != nil {
		l.lease.hold(leaseW, l.window)
	}
	ts := &tenantSys{shimDone: make(chan struct{}), startDir: startDir, window: l.window}
	ts.pidNS, _ = os.Readlink(fmt.Sprintf("/proc/%d/ns/pid", sp.proc.Pid))
	return l.relayReports(sp, ts, leaseW), ts, nil
}

// sendConfig writes data, the Config, to sp's config pipe with tree and,
// for a fenced task, leaseR passed along (SCM_RIGHTS), then closes all
// three: the shim has descriptors of its own. It does not wait for a large
// Config to be read.
func (l *shimLaunch) sendConfig(sp *shimProc, data []byte, tree int, leaseR *os.File) {
	fds := []int{tree}
	if l.netns >= 0 {
		// SCM_RIGHTS gives the shim a descriptor of its own: the
		// workspace keeps its own.
		fds = append(fds, l.netns)
	}
	if l.userns >= 0 {
		fds = append(fds, l.userns) // the executor keeps its own, as the netns
	}
	if leaseR != nil {
		fds = append(fds, int(leaseR.Fd()))
	}
	cfgW := sp.cfgW
	sp.cfgW = nil
	if l.cfg.Terminal != nil {
		l.termSock = cfgW // the master comes back on it
	}
	send := func() {
		defer unix.Close(tree)
		if leaseR != nil {
			defer leaseR.Close()
		}
		// EPIPE when the shim died first; its report says why. The
		// first bytes carry the tree (SCM_RIGHTS), the rest follows.
		n, err := unix.SendmsgN(int(cfgW.Fd()), data, unix.UnixRights(fds...), nil, 0)
		if err == nil && n < len(data) {
			_, _ = cfgW.Write(data[n:])
		}
		if l.cfg.Terminal != nil {
			// The Config's end for the shim, which then sends the
			// master on the same socket.
			_ = unix.Shutdown(int(cfgW.Fd()), unix.SHUT_WR)
			return
		}
		_ = cfgW.Close()
	}
	if len(data) <= pipeCapacity {
		// An empty pipe takes it without blocking: no goroutine to
		// schedule on the start's path.
		send()
	} else {
		go send()
	}
}

// awaitStart reads the shim's reports after its Config: a workspace task's
// start directory, then the shell's start or the step that failed (the
// ready report was taken by awaitReady). Its error is a [*StartError].
func (l *shimLaunch) awaitStart(sp *shimProc) (*shim.StartDir, error) {
	rep, err := sp.nextReport()
	var startDir *shim.StartDir
	if err == nil && rep.WorkDir != nil && l.cfg.Workspace != nil {
		// A workspace task's start directory comes before the start.
		startDir = rep.WorkDir
		rep, err = sp.nextReport()
	}
	if err == nil && rep.Ready {
		err = errors.New("the shim reported ready twice")
	}
	if err != nil {
		// The shim died or hangs before it reported: name the binary.
		err = fmt.Errorf("%s: %w", sp.path, err)
	}
	if err == nil && rep.Step != "" {
		err = fmt.Errorf("step %s: %s", rep.Step, rep.Err)
	}
	if err == nil && rep.Exited {
		err = errors.New("the shim reported an exit before the shell's start")
	}
	if err != nil {
		switch rep.Step {
		case "workdir":
			return nil, startErr(ErrWorkingDirMissing, rep.Err, nil)
		case shim.StepShell:
			return nil, startErr(ErrImageShellMissing, rep.Err, nil)
		}
		return nil, startErr(ErrIsolation, "", err)
	}
	return startDir, nil
}

// relayReports reads the shim's reports after the shell's start until the
// shim ends, noting a carry record and a fence in ts, and returns the
// channel that receives the shell's exit status: the one the shim
// reported, else the shim's own. Once the shim is reaped it closes
// ts.shimDone and ends the lease on leaseW, if any.
func (l *shimLaunch) relayReports(sp *shimProc, ts *tenantSys, leaseW *os.File) <-chan exitStatus {
	shellCh := make(chan exitStatus, 1)
	r, repR, exitCh := sp.rep, sp.repR, sp.exitCh
	go func() {
		defer repR.Close()
		var sent bool
		for {
			rep, err := readReport(r)
			if err != nil {
				break
			}
			if rep.Carry != nil {
				ts.carry = rep.Carry // before the status is sent: the supervisor reads it after
			}
			if rep.Fenced {
				ts.fenced = true // as the carry record
			}
			if rep.Exited {
				shellCh <- exitStatus{status: unix.WaitStatus(rep.Status)}
				sent = true
			}
		}
		st := <-exitCh
		close(ts.shimDone)
		if leaseW != nil {
			l.lease.release(leaseW)
		}
		if !sent {
			if st.err == nil && st.status.Exited() {
				// The shim ended on its own without the shell's status
				// (it failed): no exit code is the shell's.
				st = exitStatus{err: fmt.Errorf("the task's shim exited with status %d before it reported the shell's exit", st.status.ExitStatus())}
			}
			// Else killed before the shell's status was reported
			// (SIGKILL reaches the shim as PID 1 and the kernel then
			// kills the namespace): the shim's status is the task's.
			shellCh <- st
		}
	}()
	return shellCh
}

func readReport(r *bufio.Reader) (shim.Report, error) {
	line, err := r.ReadString('\n')
	if err != nil {
		if errors.Is(err, io.EOF) {
			err = errors.New("the shim ended without a report")
		}
		return shim.Report{}, err
	}
	return shim.ParseReport(line[:len(line)-1])
}

// tenantLeftovers counts the processes of the task other than the shim:
// the members of its cgroup, or without one those of its PID namespace.
func (t *Task) tenantLeftovers() int {
	s := &t.sys
	if s.cg != nil {
		return len(slices.DeleteFunc(s.cg.procs(), func(pid int) bool { return pid == s.pid }))
	}
	if s.tenant.gone() || s.tenant.pidNS == "" {
		return 0
	}
	n := 0
	for _, pid := range procfs.PIDs() {
		if pid == s.pid {
			continue
		}
		if ns, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/pid", pid)); err == nil && ns == s.tenant.pidNS {
			n++
		}
	}
	return n
}

// signalTenant signals the task through its shim: SIGTERM and the like go
// to the shim, which forwards them to every process of the namespace (so
// each gets it once), SIGKILL goes to the cgroup and the shim, whose death
// makes the kernel kill the whole namespace.
func (t *Task) signalTenant(sig unix.Signal) {
	s := &t.sys
	if sig == unix.SIGKILL && s.cg != nil {
		s.cg.kill()
	}
	if !s.tenant.gone() {
		_ = unix.Kill(s.pid, sig)
	}
}

// waitShim waits up to limit for the shim to exit after the shell did:
// it exits on its own once the last process of its namespace is gone.
func (t *Task) waitShim(limit time.Duration) bool {
	timer := time.NewTimer(limit)
	defer timer.Stop()
	select {
	case <-t.sys.tenant.shimDone:
		return true
	case <-timer.C:
		return false
	}
}
