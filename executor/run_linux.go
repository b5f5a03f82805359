//go:build linux

package executor

import (
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/bashtask/bashtask-operator/internal/procfs"
)

// Timing of the stop procedure.
const (
	// pollMin and pollMax bound the interval at which a stopping task is
	// checked for being empty (backing off from fast to cheap).
	pollMin = time.Millisecond
	pollMax = 50 * time.Millisecond
	// killWait bounds the wait for processes to disappear after SIGKILL;
	// only a process stuck in the kernel (uninterruptible sleep) takes
	// longer, and the task must still end.
	killWait = 5 * time.Second
	// shimExitWait is the least time a tenant task's shim gets to exit on
	// its own after the shell did, whatever the grace period: it takes
	// well under a millisecond, and a shorter grace (none at all, or a
	// few milliseconds) must not have a task that left nothing behind
	// stopped as if it had.
	shimExitWait = 100 * time.Millisecond
	// drainTimeout is how long output is read after every process of the
	// task is gone before the pipes are cut: only a process outside the
	// task's reach (one that left the process group on a node without
	// cgroups) can still hold them open.
	drainTimeout = time.Second
	// pipeSize is requested for the output pipes (F_SETPIPE_SZ) so a chatty
	// task runs ahead of the reader by a megabyte, not 64 KiB; the default
	// fs.pipe-max-size allows it. Best effort.
	pipeSize = 1 << 20
	// pipeCapacity is what a new pipe holds before a write blocks, the
	// kernel's default (16 pages, pipe(7)).
	pipeCapacity = 64 << 10
)

// taskSys is the Linux part of a Task; only the supervisor goroutine
// touches it after start.
type taskSys struct {
	proc        *os.Process
	pid         int    // shell pid, also its session and process group id
	startTicks  uint64 // the shell's start time, /proc/<pid>/stat field 22; 0 if unknown
	exitCh      <-chan exitStatus
	cg          *taskCgroup // nil: process group only
	notEnforced []string
	groupGone   bool // the process group is known to be empty: never signal it again
	startTime   time.Time
	tenant      *tenantSys // nil at the process level
	pooledShim  bool       // the task's shim was started ahead of it
	iso         IsolationResult
	net         *egressLink  // NetworkEgress: the task's veth pair, released when it ended
	guard       *egressGuard // Spec.Egress: its enforcement on net, closed when the task ended

	stdinW           *os.File // nil when stdin is /dev/null
	stdoutR, stderrR *os.File
	readersDone      chan struct{}
}

func (e *Executor) start(p *prepared) (_ *Task, err error) {
	// t, not the named result, so the cleanup below still sees it after a
	// failing return has set the result to nil.
	t := &Task{spec: p, exec: e, cancel: make(chan struct{}), done: make(chan struct{})}
	s := &t.sys

	// startShell and startTenant close what they opened when they fail;
	// the task's cgroup is removed here.
	defer func() {
		if err != nil && s.cg != nil {
			_ = s.cg.remove()
		}
	}()

	// The spill files themselves are created with each stream's first
	// byte, after the start; nothing here needs undoing.
	if t.order, err = newOrderJournal(p.spill); err != nil {
		return nil, err
	}
	if t.stdout, err = newOrderedStream(p.spill, "stdout", p.TailBytes, p.SpillLimitBytes, t.order); err != nil {
		return nil, err
	}
	if t.stderr, err = newOrderedStream(p.spill, "stderr", p.TailBytes, p.SpillLimitBytes, t.order); err != nil {
		return nil, err
	}

	tenant := e.isolation == IsolationTenant
	if tenant && p.Limits.Pids == 0 && e.taskProcs > 0 && e.caps.Pids {
		p.Limits.Pids = e.taskProcs
	}
	if tenant {
		err = e.startTenant(t)
	} else if err = e.createTaskCgroup(t); err == nil {
		s.notEnforced = p.withDiskNotEnforced(s.notEnforced)
		err = e.startShell(t)
	}
	if s.cg != nil {
		s.cg.closeFD()
	}
	if err != nil {
		return nil, err
	}

	// From here on the task owns everything; failure is no longer possible.
	// The last reader to finish closes readersDone itself, so no goroutine
	// sits between the readers and the supervisor.
	s.readersDone = make(chan struct{})
	var readers atomic.Int32
	readers.Store(2)
	read := func(st *stream, r *os.File) {
		st.readFrom(r)
		if readers.Add(-1) == 0 {
			close(s.readersDone)
		}
	}
	if p.Terminal != nil {
		t.term = &Terminal{master: s.stdoutR}
	}
	go read(t.stdout, s.stdoutR)
	go read(t.stderr, s.stderrR)
	if p.StdinStream != nil {
		// The feeder owns the write end from here on.
		t.stdin = newStdinFeeder(s.stdinW, p.StdinStream.IdleTimeout)
		s.stdinW = nil
	} else if s.stdinW != nil {
		go func() {
			// EPIPE (the task exited without reading) and ErrClosed (the
			// supervisor closed the pipe because the task ended) are not
			// errors: stdin is offered, not forced.
			_, _ = s.stdinW.Write(p.Stdin)
			_ = s.stdinW.Close()
		}()
	}
	go t.supervise()
	return t, nil
}

// createTaskCgroup gives t a cgroup of its own named after its ID (or a
// random name), with its limits, where the executor has a cgroup parent.
func (e *Executor) createTaskCgroup(t *Task) (err error) {
	s, p := &t.sys, t.spec
	if e.cg == nil {
		s.notEnforced = requestedLimits(p.Limits)
		return nil
	}
	name := p.ID
	if name == "" {
		name = "task-" + randomName()
	}
	if s.cg, s.notEnforced, err = e.cg.create(name, p.Limits); err != nil {
		return startErr(ErrProcessStart, "", err)
	}
	return nil
}

// startShell starts t's shell at the process level: in a new session, in
// the task's cgroup from its first instruction, as the task's user.
func (e *Executor) startShell(t *Task) (err error) {
	s, p := &t.sys, t.spec
	var childFiles [3]*os.File
	defer func() {
		for i, f := range childFiles {
			if f != nil && (i == 0 || f != childFiles[i-1]) {
				f.Close()
			}
		}
		if err != nil {
			for _, f := range []*os.File{s.stdinW, s.stdoutR, s.stderrR} {
				if f != nil {
					f.Close()
				}
			}
			s.stdinW, s.stdoutR, s.stderrR = nil, nil, nil
		}
	}()
	// stdin: /dev/null is a character device, so `cat` sees EOF at once and
	// `test -c /dev/stdin` holds; given bytes go through a pipe.
	if !p.stdinPipe() {
		fd, err := unix.Open(os.DevNull, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			return startErr(ErrProcessStart, "opening "+os.DevNull, err)
		}
		childFiles[0] = os.NewFile(uintptr(fd), os.DevNull)
	} else if s.stdinW, childFiles[0], err = childPipe(false); err != nil {
		return startErr(ErrProcessStart, "creating stdin pipe", err)
	}
	if s.stdoutR, childFiles[1], err = childPipe(true); err != nil {
		return startErr(ErrProcessStart, "creating stdout pipe", err)
	}
	if s.stderrR, childFiles[2], err = childPipe(true); err != nil {
		return startErr(ErrProcessStart, "creating stderr pipe", err)
	}
	if p.Terminal != nil {
		if err := useNodeTerminal(s, &childFiles, p); err != nil {
			return err
		}
	}

	sys := &syscall.SysProcAttr{
		// A new session: its own process group, no controlling terminal,
		// and a terminal's hang-up or ^C never reaches it.
		Setsid: true,
		// With a terminal, it is the session's controlling terminal
		// (TIOCSCTTY on the child's descriptor 0).
		Setctty: p.Terminal != nil,
		// No Pdeathsig: it fires when the forking OS thread exits, not the
		// agent, and would kill only the shell. A restarted agent finds and
		// stops what is left of earlier tasks through their cgroups.
	}
	if s.cg != nil {
		// clone3(CLONE_INTO_CGROUP): the shell is in the task's cgroup from
		// its first instruction, so not even a fork racing the start can
		// land outside it.
		sys.UseCgroupFD = true
		sys.CgroupFD = s.cg.fd
	}
	s.iso = IsolationResult{Level: IsolationProcess, Network: NetworkNode}
	if u := p.User; u != nil {
		groups := u.Groups
		if groups == nil {
			groups = []uint32{}
		}
		sys.Credential = &syscall.Credential{Uid: u.UID, Gid: u.GID, Groups: groups}
		s.iso.UID = &u.UID
	}
	argv := []string{e.shell, "-c", p.Command}
	attr := &os.ProcAttr{Dir: p.WorkingDir, Env: p.env, Files: childFiles[:], Sys: sys}
	proc, startTicks, exitCh, err := startWaited(func(pidfd *int) (*os.Process, error) {
		sys.PidFD = pidfd
		return os.StartProcess(e.shell, argv, attr)
	})
	s.startTime = time.Now()
	if err != nil {
		if errors.Is(err, unix.E2BIG) {
			return startErr(ErrArgumentTooLong, argEnvMessage(e.shell, argv, p.env, stackLimit()), err)
		}
		return startErr(ErrProcessStart, fmt.Sprintf("%s -c in %s", e.shell, p.WorkingDir), err)
	}
	s.proc, s.pid, s.startTicks, s.exitCh = proc, proc.Pid, startTicks, exitCh
	return nil
}

// PID is the shell's process id, which is also the id of the task's session
// and process group; at IsolationTenant the id of the task's shim, whose
// death ends every process of the task. It stays valid after the task ended, when the id may
// already name another process: check [Task.ProcessStart] before using it
// on a live system.
func (t *Task) PID() int { return t.sys.pid }

// ProcessStart is the shell's start time in clock ticks after boot
// (sysconf(_SC_CLK_TCK), field 22 "starttime" of /proc/<pid>/stat). A pid
// and its start time together name one process for the life of the boot;
// a later process that reuses the pid has a different start time. It is 0
// when the shell exited and was reaped before the executor could read it
// (a command that ends at once), since the pid may then be reused.
func (t *Task) ProcessStart() uint64 { return t.sys.startTicks }

// PooledShim reports whether the task, at IsolationTenant, took a shim
// started ahead of it ([Config.ShimPoolSize]) rather than waiting for one
// to start.
func (t *Task) PooledShim() bool { return t.sys.pooledShim }

// Isolation is the isolation the task got, as [Result.Isolation] will
// report it; known once Start returned, so a running task can show it.
func (t *Task) Isolation() IsolationResult { return t.sys.iso }

// LimitsNotEnforced names each limit the task asked for that its node
// does not enforce, as [Result.LimitsNotEnforced] will report it; known
// once Start returned, so a running task can show it.
func (t *Task) LimitsNotEnforced() []string { return slices.Clone(t.sys.notEnforced) }

// CgroupPath is the absolute path of the task's own cgroup directory, empty
// when the task has none (MechanismProcessGroup). The executor removes the
// directory when the task ends.
func (t *Task) CgroupPath() string {
	if t.sys.cg == nil {
		return ""
	}
	return t.sys.cg.path
}

// childPipe creates a pipe whose one end goes to the child and whose other
// end stays with the executor. The child's end is a plain blocking
// descriptor, as a program expects of its standard streams, and never
// enters the runtime's poller; only the executor's end does, so the reader
// can be cut with a deadline. os.Pipe would register both ends and
// os.StartProcess would switch the child's back to blocking mode: about
// five system calls more per pipe, all of them before the fork.
// childWrites says which end is the child's: the write end for stdout and
// stderr, the read end for stdin.
func childPipe(childWrites bool) (own, child *os.File, err error) {
	var p [2]int
	if err := unix.Pipe2(p[:], unix.O_CLOEXEC); err != nil {
		return nil, nil, err
	}
	ownFD, childFD := p[0], p[1]
	if !childWrites {
		ownFD, childFD = p[1], p[0]
	}
	if childWrites {
		// A chatty task runs ahead of the reader by pipeSize instead of
		// 64 KiB. Best effort: fs.pipe-max-size may be lower.
		_, _ = unix.FcntlInt(uintptr(childFD), unix.F_SETPIPE_SZ, pipeSize)
	}
	// os.NewFile puts a non-blocking descriptor into the poller. A new
	// pipe has no other status flags to keep.
	if _, err := unix.FcntlInt(uintptr(ownFD), unix.F_SETFL, unix.O_NONBLOCK); err != nil {
		unix.Close(ownFD)
		unix.Close(childFD)
		return nil, nil, err
	}
	return os.NewFile(uintptr(ownFD), "|executor"), os.NewFile(uintptr(childFD), "|child"), nil
}

func requestedLimits(l Limits) []string {
	var out []string
	if l.CPUMillis > 0 {
		out = append(out, "cpu")
	}
	if l.MemoryBytes > 0 {
		out = append(out, "memory")
	}
	if l.Pids > 0 {
		out = append(out, "pids")
	}
	return out
}

// supervise runs for the life of the task: it waits for the shell, the
// deadline or a cancel, stops what is left, collects the output and
// publishes the Result.
func (t *Task) supervise() {
	s := &t.sys
	var deadline <-chan time.Time
	if t.spec.Timeout > 0 {
		// time.Timer runs on the monotonic clock: a wall-clock step does
		// not move the deadline.
		timer := time.NewTimer(t.spec.Timeout)
		defer timer.Stop()
		deadline = timer.C
	}

	var cause Reason
	var st exitStatus
	leftovers := 0
	select {
	case st = <-s.exitCh:
		// The shell's exit is the command's result; anything of the task
		// still alive is stopped the same way as on a timeout.
		leftovers = t.countLeftovers()
		if leftovers > 0 || (s.tenant != nil && !t.waitShim(max(t.spec.KillGrace, shimExitWait))) {
			t.terminate(nil)
		}
	case <-deadline:
		cause = ReasonTimedOut
		st = t.terminate(s.exitCh)
	case <-t.cancel:
		cause = ReasonCancelled
		st = t.terminate(s.exitCh)
	}

	if s.stdinW != nil {
		// Unblocks the stdin writer if nothing ever read.
		_ = s.stdinW.Close()
	}
	if t.stdin != nil {
		t.stdin.shutdown()
	}
	t.drainOutput()

	var problems []string
	oom, cleanupFailed := false, false
	if s.cg != nil {
		oom = s.cg.oomKilled()
		if err := s.cg.remove(); err != nil {
			problems = append(problems, err.Error())
			cleanupFailed = true
		}
	}
	// Every process of the task is gone: its address may be reused.
	if s.guard != nil {
		s.guard.close()
	}
	s.net.release()
	_ = s.proc.Release()
	stdout, err := t.stdout.finish()
	if err != nil {
		problems = append(problems, err.Error())
	}
	stderr, err := t.stderr.finish()
	if err != nil {
		problems = append(problems, err.Error())
	}
	if err := t.order.close(); err != nil {
		problems = append(problems, fmt.Sprintf("writing the order journal %s: %v", t.order.path, err))
	}
	if t.spec.ownWorkDir {
		if err := t.spec.removeWorkDir(); err != nil {
			problems = append(problems, err.Error())
			cleanupFailed = true
		}
	}
	if err := t.spec.removeRoot(); err != nil {
		problems = append(problems, err.Error())
		cleanupFailed = true
	}

	res := Result{
		PID:               s.pid,
		StartTime:         s.startTime,
		EndTime:           time.Now(),
		LeftoverProcesses: leftovers,
		LimitsNotEnforced: s.notEnforced,
		CleanupFailed:     cleanupFailed,
		Isolation:         s.iso,
		Stdout:            stdout,
		Stderr:            stderr,
	}
	if s.cg == nil {
		res.Mechanism = MechanismProcessGroup
	} else {
		res.Mechanism = MechanismCgroup
	}
	res.Reason, res.ExitCode, res.Signal = classify(cause, oom, st)
	if s.tenant != nil && s.tenant.fenced {
		problems = append(problems, fmt.Sprintf("fenced: the node's lease on its workspaces lapsed (no controller watched this agent for %v), so the task was stopped before its workspace could run elsewhere", s.tenant.window))
	}
	res.Message = message(res, t.spec, st, problems)
	t.workspaceResult(&res)
	t.result = res
	close(t.done)
}

// classify applies docs/executor.md's order: deadline, cancel, OOM,
// signal, exit code. The exit code of a signaled shell is 128+n.
func classify(cause Reason, oom bool, st exitStatus) (reason Reason, exitCode int, signal string) {
	exitCode = -1
	switch {
	case st.err != nil:
	case st.status.Signaled():
		exitCode = 128 + int(st.status.Signal())
		signal = unix.SignalName(st.status.Signal())
	default:
		exitCode = st.status.ExitStatus()
	}
	switch {
	case cause != "":
		reason = cause
	case oom:
		reason = ReasonOOMKilled
	case st.err != nil:
		reason = ReasonNonZeroExit
	case signal != "":
		reason = ReasonSignaled
	case exitCode == 0:
		reason = ReasonSucceeded
	default:
		reason = ReasonNonZeroExit
	}
	return reason, exitCode, signal
}

func message(r Result, p *prepared, st exitStatus, problems []string) string {
	var parts []string
	switch r.Reason {
	case ReasonTimedOut:
		parts = append(parts, fmt.Sprintf("timed out after %v", p.Timeout))
	case ReasonCancelled:
		parts = append(parts, "cancelled")
	case ReasonOOMKilled:
		parts = append(parts, "killed by the OOM killer in the task's cgroup")
	}
	switch {
	case st.err != nil:
		parts = append(parts, "exit status lost: "+st.err.Error())
	case r.Signal != "":
		parts = append(parts, "shell killed by "+r.Signal)
	default:
		parts = append(parts, fmt.Sprintf("shell exited with status %d", r.ExitCode))
	}
	if r.LeftoverProcesses > 0 {
		parts = append(parts, fmt.Sprintf("stopped %d leftover processes", r.LeftoverProcesses))
	}
	if len(r.LimitsNotEnforced) > 0 {
		parts = append(parts, fmt.Sprintf("resource limits not enforced (%s): not available on this node", strings.Join(r.LimitsNotEnforced, ", ")))
	}
	parts = append(parts, problems...)
	return strings.Join(parts, "; ")
}

// countLeftovers counts the live processes of the task other than the
// reaped shell.
func (t *Task) countLeftovers() int {
	s := &t.sys
	if s.tenant != nil {
		return t.tenantLeftovers()
	}
	if s.cg != nil {
		return len(s.cg.procs())
	}
	if t.groupEmpty() {
		return 0
	}
	return len(sessionMembers(s.pid))
}

// groupEmpty probes the process group with signal 0 and remembers a
// negative answer for good: once a group is empty its id may be reused.
func (t *Task) groupEmpty() bool {
	s := &t.sys
	if !s.groupGone && errors.Is(unix.Kill(-s.pid, 0), unix.ESRCH) {
		s.groupGone = true
	}
	return s.groupGone
}

// empty reports whether no process of the task is alive.
func (t *Task) empty() bool {
	s := &t.sys
	if s.tenant != nil && (s.cg == nil || !s.tenant.gone()) {
		// The shim leaves the cgroup when it exits, before it is reaped;
		// the task is over once it is reaped, the last process of its
		// namespace and of its UID.
		return s.tenant.gone()
	}
	if s.cg != nil {
		if s.cg.populated() {
			return false
		}
		// Every member of the process group was born in the cgroup, so
		// the group is gone too.
		s.groupGone = true
		return true
	}
	return t.groupEmpty()
}

// signalAll sends sig to every process of the task: each process listed in
// the cgroup (SIGKILL through cgroup.kill), the process group unless it is
// known to be gone, and without a cgroup the session's members in other
// process groups.
func (t *Task) signalAll(sig unix.Signal) {
	s := &t.sys
	if s.tenant != nil {
		t.signalTenant(sig)
		return
	}
	if s.cg != nil {
		if sig == unix.SIGKILL {
			s.cg.kill()
		} else {
			// There is no cgroup-wide SIGTERM; a process that exits and
			// whose pid is reused between the read and the kill is the
			// known, microsecond-wide gap of this approach.
			for _, pid := range s.cg.procs() {
				_ = unix.Kill(pid, sig)
			}
		}
		if !s.cg.populated() {
			s.groupGone = true
		}
	}
	if !s.groupGone {
		if errors.Is(unix.Kill(-s.pid, sig), unix.ESRCH) {
			s.groupGone = true
		}
	}
	if s.cg == nil {
		for _, pid := range sessionMembers(s.pid) {
			_ = unix.Kill(pid, sig)
		}
	}
}

// terminate stops the task: SIGTERM to everything, the grace period or
// until all is gone, then SIGKILL, then wait for the processes to
// disappear. exitCh is the shell's status channel while the shell is
// alive (nil once it was reaped); terminate returns that status.
func (t *Task) terminate(exitCh <-chan exitStatus) (st exitStatus) {
	shellDone := exitCh == nil
	waitGone := func(limit time.Duration) bool {
		timer := time.NewTimer(limit)
		defer timer.Stop()
		interval := pollMin
		for {
			if shellDone && t.empty() {
				return true
			}
			poll := time.NewTimer(interval)
			select {
			case st = <-exitCh:
				shellDone, exitCh = true, nil
			case <-timer.C:
				poll.Stop()
				return false
			case <-poll.C:
				interval = min(2*interval, pollMax)
			}
			poll.Stop()
		}
	}
	t.signalAll(unix.SIGTERM)
	if !waitGone(t.spec.KillGrace) {
		t.signalAll(unix.SIGKILL)
		waitGone(killWait)
	}
	if !shellDone {
		// SIGKILLed; only a process stuck in the kernel delays this.
		st = <-exitCh
	}
	return st
}

// drainOutput waits for both output readers. Normally they end at EOF as
// soon as the last process of the task is gone; a process out of reach
// holding a pipe gets drainTimeout before the read is cut with a deadline.
func (t *Task) drainOutput() {
	s := &t.sys
	timer := time.NewTimer(drainTimeout)
	defer timer.Stop()
	select {
	case <-s.readersDone:
	case <-timer.C:
		_ = s.stdoutR.SetReadDeadline(time.Now())
		_ = s.stderrR.SetReadDeadline(time.Now())
		<-s.readersDone
	}
	_ = s.stdoutR.Close()
	_ = s.stderrR.Close()
}

// sessionMembers lists the live (not zombie) processes whose session or
// process group is id, from /proc/<pid>/stat (proc(5)). It finds processes
// of a task that moved to another process group of the task's session.
func sessionMembers(id int) []int {
	var out []int
	for _, pid := range procfs.PIDs() {
		if pid == id {
			continue
		}
		st, err := procfs.ReadStat(pid)
		if err == nil && st.State != 'Z' && (st.PGRP == id || st.Session == id) {
			out = append(out, pid)
		}
	}
	return out
}
