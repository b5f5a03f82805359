package localcluster

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	goruntime "runtime"
	"strconv"
	"sync"
	"syscall"
	"time"
)

// Process is one component the launcher supervises. Like a kubelet, the
// launcher starts it again when it exits while the cluster runs (a second
// later, or after the delay a Kill asked for), so tests and the chaos run
// can kill a controller or an agent and watch it come back. Its output is
// appended to one log across restarts, each run under a header line.
type Process struct {
	name, bin string
	args, env []string
	logPath   string
	dir       string // the cluster's directory: pids/ and hold/
	log       func(msg string, args ...any)
	recordPID func(name string, pid int)

	mu        sync.Mutex
	cmd       *exec.Cmd // the current run
	exited    chan struct{}
	stopping  bool
	stopped   bool // SIGSTOPped, until SIGCONT or the run ends
	nextDelay time.Duration
	runs      int

	firstExit chan struct{} // closed when the first run ends
	done      chan struct{} // closed when the supervisor returns
}

// Name is the component's name, such as "controller" or "agent-node-1";
// its log is logs/<name>.log and its pid file pids/<name>.
func (p *Process) Name() string { return p.name }

// LogPath is the file the component's output is appended to.
func (p *Process) LogPath() string { return p.logPath }

// PID is the current run's process id, 0 when none runs.
func (p *Process) PID() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil || p.cmd.Process == nil {
		return 0
	}
	return p.cmd.Process.Pid
}

// Stopped reports whether the current run was stopped with SIGSTOP
// through Signal and not yet continued.
func (p *Process) Stopped() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.stopped
}

// Kill sends SIGKILL to the current run and has the supervisor start the
// next run restartAfter after this one exited (instead of the usual
// second). It returns once the run exited.
func (p *Process) Kill(restartAfter time.Duration) error {
	p.mu.Lock()
	cmd, exited := p.cmd, p.exited
	p.nextDelay = restartAfter
	p.mu.Unlock()
	if cmd == nil {
		return fmt.Errorf("%s is not running", p.name)
	}
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		return fmt.Errorf("killing %s: %w", p.name, err)
	}
	select {
	case <-exited:
		return nil
	case <-time.After(10 * time.Second):
		return fmt.Errorf("%s (pid %d) did not exit 10 s after SIGKILL", p.name, cmd.Process.Pid)
	}
}

// Signal sends sig to the current run; SIGSTOP and SIGCONT are tracked
// for Stopped.
func (p *Process) Signal(sig syscall.Signal) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil {
		return fmt.Errorf("%s is not running", p.name)
	}
	if err := p.cmd.Process.Signal(sig); err != nil {
		return fmt.Errorf("sending %s to %s: %w", sig, p.name, err)
	}
	switch sig {
	case syscall.SIGSTOP:
		p.stopped = true
	case syscall.SIGCONT:
		p.stopped = false
	}
	return nil
}

// startProcess starts a supervised child and returns once its first run
// started (or failed to).
func startProcess(p *Process) error {
	p.firstExit = make(chan struct{})
	p.done = make(chan struct{})
	p.nextDelay = time.Second
	if err := os.MkdirAll(filepath.Join(p.dir, "pids"), 0o700); err != nil {
		return err
	}
	started := make(chan error, 1)
	go p.supervise(started)
	return <-started
}

// supervise runs p until it is stopped, restarting it whenever it exits.
// It runs on an OS thread of its own, locked for its whole life, because
// PR_SET_PDEATHSIG ties each child to the thread that forked it: the child
// is killed when this goroutine (and so its thread) ends, or when the
// whole launcher dies.
func (p *Process) supervise(started chan<- error) {
	goruntime.LockOSThread()
	defer close(p.done)
	first := true
	for {
		cmd, exited, err := p.run()
		switch {
		case first:
			started <- err
			first = false
			if err != nil {
				return
			}
			p.log("Started", "component", p.name, "pid", cmd.Process.Pid, "log", p.logPath)
		case err != nil:
			p.log("Restarting failed", "component", p.name, "err", err)
		default:
			p.log("Restarted", "component", p.name, "pid", cmd.Process.Pid, "runs", p.runs)
		}
		if cmd != nil {
			werr := cmd.Wait()
			if f, ok := cmd.Stdout.(*os.File); ok {
				_ = f.Close()
			}
			close(exited)
			select {
			case <-p.firstExit:
			default:
				close(p.firstExit)
			}
			p.mu.Lock()
			stopping := p.stopping
			p.stopped = false
			p.mu.Unlock()
			if stopping {
				return
			}
			p.log("Exited; restarting", "component", p.name, "status", werr)
		}
		p.mu.Lock()
		delay := p.nextDelay
		p.nextDelay = time.Second
		p.mu.Unlock()
		time.Sleep(delay)
		if p.held() {
			return
		}
		p.mu.Lock()
		stopping := p.stopping
		p.mu.Unlock()
		if stopping {
			return
		}
	}
}

// HoldPath is the file that keeps a supervised component down once it
// exits: while hold/<name> exists under the cluster's directory, the
// launcher does not start it again, as for a node that is gone. Removing
// the file lets it start.
func HoldPath(dir, name string) string {
	return filepath.Join(dir, "hold", name)
}

// held waits while p's hold file exists; true when the cluster stops
// meanwhile.
func (p *Process) held() bool {
	pidRemoved := false
	for {
		if _, err := os.Stat(HoldPath(p.dir, p.name)); err != nil {
			return false
		}
		if !pidRemoved {
			pidRemoved = true
			_ = os.Remove(filepath.Join(p.dir, "pids", p.name))
		}
		p.mu.Lock()
		stopping := p.stopping
		p.mu.Unlock()
		if stopping {
			return true
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// run starts one run of p.
func (p *Process) run() (*exec.Cmd, chan struct{}, error) {
	logf, err := os.OpenFile(p.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, nil, fmt.Errorf("opening %s: %w", p.logPath, err)
	}
	cmd := exec.Command(p.bin, p.args...)
	cmd.Env = p.env
	cmd.Stdout, cmd.Stderr = logf, logf
	// A process group of its own keeps a terminal's Ctrl-C from reaching
	// the child before the launcher stops it in order.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.stopping {
		_ = logf.Close()
		return nil, nil, errors.New("stopping")
	}
	p.runs++
	// A header per run: one log holds every run, and a reader must tell
	// where a restart began.
	_, _ = fmt.Fprintf(logf, "==== run %d of %s at %s\n", p.runs, p.name, time.Now().UTC().Format(time.RFC3339Nano))
	if err := cmd.Start(); err != nil {
		_ = logf.Close()
		return nil, nil, fmt.Errorf("starting %s: %w", p.name, err)
	}
	p.cmd = cmd
	p.exited = make(chan struct{})
	_ = os.WriteFile(filepath.Join(p.dir, "pids", p.name), []byte(strconv.Itoa(cmd.Process.Pid)+"\n"), 0o600)
	if p.recordPID != nil {
		p.recordPID(p.name, cmd.Process.Pid)
	}
	return cmd, p.exited, nil
}

// stop ends p's supervision: SIGCONT (a stopped process cannot handle
// SIGTERM), SIGTERM, then SIGKILL after grace.
func (p *Process) stop(grace time.Duration) (killed bool) {
	p.mu.Lock()
	p.stopping = true
	cmd := p.cmd
	p.mu.Unlock()
	if cmd != nil {
		_ = cmd.Process.Signal(syscall.SIGCONT)
		_ = cmd.Process.Signal(syscall.SIGTERM)
	}
	select {
	case <-p.done:
		return false
	case <-time.After(grace):
	}
	if cmd != nil {
		_ = cmd.Process.Kill()
	}
	<-p.done
	return true
}
