package main

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	goruntime "runtime"
	"sync"
	"syscall"
	"time"
)

// proc is one supervised component. Like a kubelet, the supervisor starts
// it again when it exits (after restartDelay, 1 s unless a fault set
// another), so a controller that exits on a lost lease comes back. Its
// output is appended to one log across restarts, each run under a header.
type proc struct {
	name, bin string
	args, env []string
	logPath   string
	log       func(format string, args ...any)

	mu        sync.Mutex
	cmd       *exec.Cmd
	stopping  bool
	stopped   bool // SIGSTOPped by a fault
	nextDelay time.Duration
	runs      int
	exited    chan struct{} // replaced at each start; closed when that run ends

	done chan struct{}
}

// startProc starts p and returns once the first run started.
func startProc(p *proc) error {
	p.done = make(chan struct{})
	started := make(chan error, 1)
	go p.supervise(started)
	return <-started
}

// supervise runs p until stop, on an OS thread of its own locked for its
// whole life, because PR_SET_PDEATHSIG ties each child to the thread that
// forked it: the child is killed when the harness dies.
func (p *proc) supervise(started chan<- error) {
	goruntime.LockOSThread()
	defer close(p.done)
	first := true
	for {
		cmd, exited, err := p.run()
		if first {
			started <- err
			first = false
			if err != nil {
				return
			}
		} else if err != nil {
			p.log("%s: restart failed: %v", p.name, err)
		}
		if cmd != nil {
			werr := cmd.Wait()
			if f, ok := cmd.Stdout.(*os.File); ok {
				_ = f.Close()
			}
			close(exited)
			p.mu.Lock()
			stopping := p.stopping
			p.stopped = false
			p.mu.Unlock()
			if stopping {
				return
			}
			p.log("%s exited (%v)", p.name, werr)
		}
		p.mu.Lock()
		delay := p.nextDelay
		p.nextDelay = time.Second
		p.mu.Unlock()
		time.Sleep(delay)
		p.mu.Lock()
		stopping := p.stopping
		p.mu.Unlock()
		if stopping {
			return
		}
	}
}

func (p *proc) run() (*exec.Cmd, chan struct{}, error) {
	logf, err := os.OpenFile(p.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, nil, fmt.Errorf("opening %s: %w", p.logPath, err)
	}
	cmd := exec.Command(p.bin, p.args...)
	cmd.Env = p.env
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.stopping {
		_ = logf.Close()
		return nil, nil, errors.New("stopping")
	}
	p.runs++
	fmt.Fprintf(logf, "==== chaos: run %d of %s at %s\n", p.runs, p.name, time.Now().UTC().Format(time.RFC3339Nano))
	if err := cmd.Start(); err != nil {
		_ = logf.Close()
		return nil, nil, fmt.Errorf("starting %s: %w", p.name, err)
	}
	p.cmd = cmd
	p.exited = make(chan struct{})
	return cmd, p.exited, nil
}

// kill sends SIGKILL to the current run and has the supervisor start the
// next one restartAfter after it exited. It returns once the run exited.
func (p *proc) kill(restartAfter time.Duration) error {
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

// signal sends sig (SIGSTOP or SIGCONT) to the current run.
func (p *proc) signal(sig syscall.Signal) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil {
		return fmt.Errorf("%s is not running", p.name)
	}
	if err := p.cmd.Process.Signal(sig); err != nil {
		return fmt.Errorf("sending %s to %s: %w", sig, p.name, err)
	}
	p.stopped = sig == syscall.SIGSTOP
	return nil
}

// stop ends supervision: SIGCONT (in case a fault stopped it), SIGTERM,
// then SIGKILL after grace.
func (p *proc) stop(grace time.Duration) {
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
		return
	case <-time.After(grace):
	}
	if cmd != nil {
		_ = cmd.Process.Kill()
	}
	<-p.done
}

// disrupt kills the process, restarting it after d (kill true), or stops
// it with SIGSTOP for d and resumes it with SIGCONT.
func (p *proc) disrupt(kill bool, d time.Duration) error {
	if kill {
		return p.kill(d)
	}
	if err := p.signal(syscall.SIGSTOP); err != nil {
		return err
	}
	time.Sleep(d)
	return p.signal(syscall.SIGCONT)
}
