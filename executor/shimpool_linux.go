//go:build linux

package executor

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/bashtask/bashtask-operator/executor/shim"
)

// shimProc is a started shim that has not been given its task yet: PID 1
// of its own mount, PID, IPC and UTS namespaces (and network namespace for
// [NetworkNone] and [NetworkEgress], the latter with its veth pair set
// up), blocked reading its Config, with the executor's ends of its pipes.
type shimProc struct {
	cg         *taskCgroup // the pooled shim's cgroup until a task takes it; nil without cgroups
	proc       *os.Process
	startTicks uint64
	exitCh     <-chan exitStatus
	exited     bool // its status was taken from exitCh: it is gone

	cfgW, repR               *os.File // the Config in, the reports out
	stdinW, stdoutR, stderrR *os.File // the task's streams

	net *egressLink // NetworkEgress: its veth pair, until a task takes it

	rep  *bufio.Reader // on repR, for every report
	path string        // the shim's binary (Config.ShimPath)
	wait time.Duration // bound of each of its first reports (Config.ShimReportTimeout)
}

// shimCloneflags are the namespaces a task's shim is created in.
func shimCloneflags(network Network) uintptr {
	flags := uintptr(unix.CLONE_NEWNS | unix.CLONE_NEWPID | unix.CLONE_NEWIPC | unix.CLONE_NEWUTS)
	if network == NetworkNone || network == NetworkEgress {
		flags |= unix.CLONE_NEWNET
	}
	return flags
}

// startShim starts a shim for a task of network in cg (nil: no cgroup)
// from its first instruction. The shim's standard streams are new pipes
// whose other ends the shimProc holds.
func (e *Executor) startShim(network Network, cg *taskCgroup) (_ *shimProc, err error) {
	sp := &shimProc{path: e.shimPath, wait: e.shimWait}
	var own, child []*os.File
	defer func() {
		for _, f := range child {
			f.Close()
		}
		if err != nil {
			for _, f := range own {
				f.Close()
			}
		}
	}()
	pipe := func(childWrites bool, ownEnd **os.File) error {
		o, c, err := childPipe(childWrites)
		if err != nil {
			return err
		}
		own, child = append(own, o), append(child, c)
		*ownEnd = o
		return nil
	}
	for _, p := range []struct {
		childWrites bool
		end         **os.File
	}{{false, &sp.stdinW}, {true, &sp.stdoutR}, {true, &sp.stderrR}} {
		if err := pipe(p.childWrites, p.end); err != nil {
			return nil, err
		}
	}
	// The Config goes through a Unix socket, which also carries the
	// working directory as a detached mount (shim.Config.WorkTree); the
	// report pipe carries a few hundred bytes: the default pipe size.
	pair, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	cfgW, cfgR := os.NewFile(uintptr(pair[0]), "config"), os.NewFile(uintptr(pair[1]), "config")
	own, child, sp.cfgW = append(own, cfgW), append(child, cfgR), cfgW
	repR, repW, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	own, child, sp.repR = append(own, repR), append(child, repW), repR
	sp.rep = bufio.NewReader(repR)
	sys := &syscall.SysProcAttr{Setsid: true, Cloneflags: shimCloneflags(network)}
	if cg != nil {
		// clone3(CLONE_INTO_CGROUP), as for the shell at the process level:
		// moving a running process (cgroup.procs) would cost the start an
		// RCU grace period, milliseconds.
		sys.UseCgroupFD, sys.CgroupFD = true, cg.fd
	}
	// child is stdin, stdout, stderr, then shim.ConfigFD and shim.ReportFD.
	// One P: the shim runs one goroutine at a time, and each thread the
	// runtime would start for more is work on the task's start.
	attr := &os.ProcAttr{Dir: "/", Env: []string{"GOMAXPROCS=1"}, Files: child, Sys: sys}
	sp.proc, sp.startTicks, sp.exitCh, err = startWaited(func(pidfd *int) (*os.Process, error) {
		sys.PidFD = pidfd
		return os.StartProcess(e.shimPath, e.shimArgv(), attr)
	})
	if err != nil {
		return nil, err
	}
	if network == NetworkEgress {
		// While the shim's runtime starts: the namespace exists from the
		// clone on, and the shim runs nothing of a task before its Config.
		if sp.net, err = e.egress.attach(sp.proc.Pid); err != nil {
			sp.discard()
			return nil, fmt.Errorf("the task's network: %w", err)
		}
	}
	return sp, nil
}

// awaitReady waits for the shim's ready report, so that a pooled shim is
// taken only once it runs and no shim is handed a Config before it said
// which protocol it speaks; it discards the shim when the report does not
// come, names another protocol (a shim binary of another build) or is
// another report. The error names the shim's binary.
func (sp *shimProc) awaitReady() error {
	rep, err := sp.nextReport()
	if err == nil && !rep.Ready {
		err = fmt.Errorf("its first report was %+v", rep)
	}
	if err != nil {
		sp.discard()
		return fmt.Errorf("%s: the shim did not report ready: %w", sp.path, err)
	}
	return nil
}

// nextReport reads the shim's next report, waiting up to sp.wait; the
// deadline applies to the first reports only (ready, then the shell's
// start or the failed step), after which reports come when the task ends.
func (sp *shimProc) nextReport() (shim.Report, error) {
	_ = sp.repR.SetReadDeadline(time.Now().Add(sp.wait))
	rep, err := readReport(sp.rep)
	_ = sp.repR.SetReadDeadline(time.Time{})
	if errors.Is(err, os.ErrDeadlineExceeded) {
		err = fmt.Errorf("no report within %v", sp.wait)
	}
	return rep, err
}

// gone reports whether the shim has exited, without waiting.
func (sp *shimProc) gone() bool {
	if sp.exited {
		return true
	}
	select {
	case <-sp.exitCh:
		sp.exited = true
	default:
	}
	return sp.exited
}

// discard kills the shim, waits for it, closes every end it left and
// removes its pooled cgroup.
func (sp *shimProc) discard() {
	if !sp.exited {
		_ = sp.proc.Signal(unix.SIGKILL)
		<-sp.exitCh
		sp.exited = true
	}
	_ = sp.proc.Release()
	sp.closeEnds()
	sp.net.release()
	sp.net = nil
	if sp.cg != nil {
		_ = sp.cg.remove()
		sp.cg = nil
	}
}

func (sp *shimProc) closeEnds() {
	for _, f := range []*os.File{sp.cfgW, sp.repR, sp.stdinW, sp.stdoutR, sp.stderrR} {
		if f != nil {
			f.Close()
		}
	}
}

// shimPool keeps shims started ahead of tasks, up to size per network,
// each in a new cgroup of its own, so that a task's start at the tenant
// level does not wait for a process to exec and a Go runtime to initialize
// (milliseconds on every start); the task takes the shim's cgroup as its
// own. A
// network is kept filled once a task has asked for it ([NetworkNode] from
// the start, [NetworkEgress] too where it is offered); the namespaces are
// created off the task's path, the network namespaces of [NetworkNone] and
// [NetworkEgress] and the latter's veth pair too. A pooled shim does nothing until it is
// taken: it is blocked reading its Config, holds no task data, and exits
// when the executor's end of its config pipe closes (the agent died).
type shimPool struct {
	e    *Executor
	size int

	mu     sync.Mutex
	idle   map[Network][]*shimProc // nil once closed
	wanted []Network               // kept filled, in the order first asked for

	kick chan struct{} // a fill is due
	stop chan struct{} // closed by close
	done chan struct{} // closed when the filler returned
}

func newShimPool(e *Executor, size int) *shimPool {
	p := &shimPool{
		e: e, size: size,
		idle:   map[Network][]*shimProc{},
		wanted: []Network{NetworkNode},
		kick:   make(chan struct{}, 1),
		stop:   make(chan struct{}),
		done:   make(chan struct{}),
	}
	if e.egress != nil {
		// The tenant level's default network where the agent offers it.
		p.wanted = append(p.wanted, NetworkEgress)
	}
	go p.fill()
	p.signal()
	return p
}

func (p *shimPool) signal() {
	select {
	case p.kick <- struct{}{}:
	default:
	}
}

// take returns a started shim for network, or nil when none is idle; either
// way the pool is refilled in the background.
func (p *shimPool) take(network Network) *shimProc {
	p.mu.Lock()
	defer p.mu.Unlock()
	defer p.signal()
	if p.idle == nil {
		return nil
	}
	if !slices.Contains(p.wanted, network) {
		p.wanted = append(p.wanted, network)
	}
	for q := p.idle[network]; len(q) > 0; q = p.idle[network] {
		sp := q[len(q)-1]
		p.idle[network] = q[:len(q)-1]
		if !sp.gone() {
			return sp
		}
		go sp.discard() // killed while idle
	}
	return nil
}

// fill starts shims until every wanted network has size idle ones, each
// time it is kicked. A failed start ends the round: the next take kicks
// again, and meanwhile tasks start their own shims.
func (p *shimPool) fill() {
	defer close(p.done)
	for {
		select {
		case <-p.stop:
			return
		case <-p.kick:
		}
		for _, network := range p.networksShort() {
			sp, err := p.start(network)
			if err != nil {
				break
			}
			p.mu.Lock()
			if p.idle == nil {
				p.mu.Unlock()
				sp.discard()
				return
			}
			p.idle[network] = append(p.idle[network], sp)
			p.mu.Unlock()
		}
	}
}

// start starts a pooled shim in a new cgroup of its own (where the
// executor has cgroups) and waits until it runs.
func (p *shimPool) start(network Network) (*shimProc, error) {
	var cg *taskCgroup
	if p.e.cg != nil {
		var err error
		if cg, err = p.e.cg.newCgroup(PoolCgroupPrefix + randomName()); err != nil {
			return nil, err
		}
	}
	sp, err := p.e.startShim(network, cg)
	if cg != nil {
		cg.closeFD()
	}
	if err != nil {
		if cg != nil {
			_ = cg.remove()
		}
		return nil, err
	}
	sp.cg = cg
	if err := sp.awaitReady(); err != nil {
		return nil, err
	}
	return sp, nil
}

// networksShort lists one entry per shim missing from the pool.
func (p *shimPool) networksShort() []Network {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []Network
	for _, n := range p.wanted {
		for range p.size - len(p.idle[n]) {
			out = append(out, n)
		}
	}
	return out
}

// close stops the filling and kills every idle shim.
func (p *shimPool) close() {
	p.mu.Lock()
	if p.idle == nil {
		p.mu.Unlock()
		return
	}
	idle := p.idle
	p.idle = nil
	p.mu.Unlock()
	close(p.stop)
	<-p.done
	for _, q := range idle {
		for _, sp := range q {
			sp.discard()
		}
	}
}

// sweepPoolCgroups kills whatever is in the pooled shims' cgroups an
// earlier executor left under parent (its pooled shims exit by themselves
// once their parent is gone; a task whose start the earlier agent did not
// live to record may not) and removes them. It runs before the executor
// starts shims of its own.
func sweepPoolCgroups(parent string) error {
	entries, err := os.ReadDir(parent)
	if err != nil {
		return err
	}
	var errs []error
	for _, e := range entries {
		if !e.IsDir() || !strings.HasPrefix(e.Name(), PoolCgroupPrefix) {
			continue
		}
		if _, err := KillCgroup(filepath.Join(parent, e.Name())); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
