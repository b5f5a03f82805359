//go:build linux

package executor

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/bashtask/bashtask-operator/executor/shim"
	"github.com/bashtask/bashtask-operator/internal/procfs"
)

// tenantSys is the part of a task that only the tenant level has: the
// shim (PID 1 of the task's PID namespace) is the process the executor
// started, and the shell is its child.
type tenantSys struct {
	shimDone chan struct{} // closed once the shim was reaped
	pidNS    string        // the task's PID namespace, readlink /proc/<shim>/ns/pid
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

// shimLaunch is a shim being started: the pipes that carry its Config in
// and its reports out.
type shimLaunch struct {
	cfg        shim.Config
	cfgR, cfgW *os.File
	repR, repW *os.File
	cloneflags uintptr
	iso        IsolationResult
}

// newShimLaunch prepares the shim of p. cgroupPids says whether the
// task's cgroup enforces the process limit (pids.max), so the shim need
// not set RLIMIT_NPROC.
func (e *Executor) newShimLaunch(p *prepared, cgroupPids bool) (*shimLaunch, error) {
	l := &shimLaunch{
		cloneflags: unix.CLONE_NEWNS | unix.CLONE_NEWPID | unix.CLONE_NEWIPC | unix.CLONE_NEWUTS,
		cfg: shim.Config{
			Shell:        e.shell,
			Command:      p.Command,
			Env:          p.env,
			WorkDir:      p.WorkingDir,
			TmpSizeBytes: e.tmpSize,
			Hostname:     e.hostname,
			Mask:         e.mask,
			Landlock:     !e.noLandlock,
			Seccomp:      !e.noSeccomp,
		},
		iso: IsolationResult{
			Level:      IsolationTenant,
			Namespaces: []string{"mnt", "pid", "ipc", "uts"},
			Network:    p.Network,
			Seccomp:    !e.noSeccomp,
		},
	}
	if !e.noLandlock {
		l.iso.LandlockABI = min(shim.LandlockABI(), 6)
	}
	if p.Network == NetworkNone {
		l.cloneflags |= unix.CLONE_NEWNET
		l.cfg.Loopback = true
		l.iso.Namespaces = append(l.iso.Namespaces, "net")
	}
	if u := p.User; u != nil {
		uid, gid := u.UID, u.GID
		l.cfg.UID, l.cfg.GID = &uid, &gid
		l.iso.UID = &uid
	}
	switch {
	case p.Limits.Pids > 0 && cgroupPids:
		l.iso.PidsLimit, l.iso.Procs = PidsLimitCgroup, p.Limits.Pids
	case e.taskProcs > 0 && p.User != nil:
		// Counted per real UID by the kernel: a per-task limit only
		// because the UID is the task's own.
		l.cfg.NProc = uint64(e.taskProcs)
		l.iso.PidsLimit, l.iso.Procs = PidsLimitRlimit, e.taskProcs
	}
	var err error
	if l.cfgR, l.cfgW, err = os.Pipe(); err != nil {
		return nil, err
	}
	if l.repR, l.repW, err = os.Pipe(); err != nil {
		l.cfgR.Close()
		l.cfgW.Close()
		return nil, err
	}
	return l, nil
}

// closeChildEnds closes the shim's ends once it has its copies.
func (l *shimLaunch) closeChildEnds() {
	l.cfgR.Close()
	l.repW.Close()
}

// close closes every end (a failed start).
func (l *shimLaunch) close() {
	l.closeChildEnds()
	l.cfgW.Close()
	l.repR.Close()
}

// handshake sends the Config and reads the shim's first report: the
// shell started, or the step that failed. On failure the shim is killed
// and reaped and the error is a [*StartError] with ErrIsolation naming the
// step. On success it returns the channel that receives the shell's exit
// status (the shim's own if it died without reporting one) and the shim's
// state.
func (l *shimLaunch) handshake(proc *os.Process, exitCh <-chan exitStatus) (<-chan exitStatus, *tenantSys, error) {
	data, err := json.Marshal(l.cfg)
	if err != nil {
		return nil, nil, err
	}
	go func() {
		// EPIPE when the shim died first; its report says why.
		_, _ = l.cfgW.Write(data)
		_ = l.cfgW.Close()
	}()
	r := bufio.NewReader(l.repR)
	rep, err := readReport(r)
	if err == nil && rep.Step != "" {
		err = fmt.Errorf("step %s: %s", rep.Step, rep.Err)
	}
	if err != nil {
		_ = proc.Signal(syscall.SIGKILL)
		<-exitCh
		l.repR.Close()
		return nil, nil, startErr(ErrIsolation, "", err)
	}
	ts := &tenantSys{shimDone: make(chan struct{})}
	ts.pidNS, _ = os.Readlink(fmt.Sprintf("/proc/%d/ns/pid", proc.Pid))
	shellCh := make(chan exitStatus, 1)
	go func() {
		defer l.repR.Close()
		var sent bool
		for {
			rep, err := readReport(r)
			if err != nil {
				break
			}
			if rep.Exited {
				shellCh <- exitStatus{status: unix.WaitStatus(rep.Status)}
				sent = true
			}
		}
		st := <-exitCh
		close(ts.shimDone)
		if !sent {
			// Killed before the shell's status was reported (SIGKILL
			// reaches the shim as PID 1 and the kernel then kills the
			// namespace): the shim's status is the task's.
			shellCh <- st
		}
	}()
	return shellCh, ts, nil
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
