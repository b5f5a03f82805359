package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"syscall"
	"time"

	"github.com/bashtask/bashtask-operator/internal/rig/localcluster"
)

// Fault kinds.
const (
	faultControllerKill = "controller-kill"
	faultControllerStop = "controller-stop"
	faultAgentKill      = "agent-kill"
	faultAPIServerKill  = "apiserver-kill"
	faultEtcdStop       = "etcd-stop"
	faultS3Stop         = "s3-stop"
	faultS3Kill         = "s3-kill"
	faultPartition      = "agent-partition"
	// faultAgentStop is a SIGSTOP of an agent that holds a workspace for
	// longer than --agent-lost-after, then SIGCONT: its tasks go on
	// while the controller gives the node up.
	faultAgentStop = "agent-stop"
	// faultSnapshotS3 stops the object store, asks for a snapshot of a
	// workspace, and lets the store go on later: the snapshot fails or
	// waits while the store is away.
	faultSnapshotS3 = "snapshot-s3-stop"
)

var faultKinds = []string{faultControllerKill, faultControllerStop, faultAgentKill, faultAPIServerKill,
	faultEtcdStop, faultS3Stop, faultS3Kill, faultPartition, faultAgentStop, faultSnapshotS3}

// plannedFault is one fault decided from the seed: its kind, the pause
// before it (after the previous fault recovered), its length and target.
type plannedFault struct {
	kind   string
	gap    time.Duration
	length time.Duration // stop or partition length, or delay before a restart
	agent  int           // index of the target agent; -1: an agent holding a workspace at the time
}

// planFaults decides n faults: every kind once in a seeded order, then
// kinds at random.
func planFaults(rng *rand.Rand, set settings, n int) []plannedFault {
	var out []plannedFault
	order := slices.Clone(faultKinds)
	rng.Shuffle(len(order), func(i, j int) { order[i], order[j] = order[j], order[i] })
	for i := range n {
		kind := faultKinds[rng.IntN(len(faultKinds))]
		if i < len(order) {
			kind = order[i]
		}
		f := plannedFault{kind: kind, gap: time.Duration(2000+rng.IntN(4000)) * time.Millisecond, agent: rng.IntN(processAgents + tenantAgents)}
		if rng.IntN(2) == 0 {
			f.agent = -1 // half the agent faults hit a workspace's agent
		}
		ms := func(lo, hi time.Duration) time.Duration {
			return lo + time.Duration(rng.Int64N(int64(hi-lo)+1))
		}
		switch kind {
		case faultControllerKill:
			f.length = ms(0, 4*time.Second)
		case faultControllerStop:
			f.length = set.leaseDuration + ms(2*time.Second, 6*time.Second)
		case faultAgentKill:
			// Sometimes back before --agent-lost-after, sometimes after.
			f.length = ms(time.Second, set.agentLostAfter*3/2)
		case faultAPIServerKill:
			f.length = ms(0, 3*time.Second)
		case faultEtcdStop:
			f.length = ms(2*time.Second, 6*time.Second)
		case faultS3Stop:
			f.length = ms(3*time.Second, 15*time.Second)
		case faultS3Kill:
			f.length = ms(time.Second, 10*time.Second)
		case faultPartition:
			f.length = set.agentLostAfter + ms(3*time.Second, 10*time.Second)
		case faultAgentStop:
			// The controller notices a stopped agent by its keepalive
			// pings (10 s, then 5 s for the answer), then waits
			// --agent-lost-after: long enough for the workspace to move.
			f.agent = -1
			f.length = 15*time.Second + set.agentLostAfter + ms(3*time.Second, 8*time.Second)
		case faultSnapshotS3:
			f.length = ms(3*time.Second, 10*time.Second)
		}
		out = append(out, f)
	}
	return out
}

// injector runs the planned faults one after the other until its context
// ends, waiting after each for the component to serve again.
type injector struct {
	c   *cluster
	ws  *workspaces
	log func(string, ...any)

	mu     sync.Mutex
	faults []FaultWindow
}

func (in *injector) run(ctx context.Context, plan []plannedFault) {
	for _, f := range plan {
		select {
		case <-ctx.Done():
			return
		case <-time.After(f.gap):
		}
		w, err := in.inject(ctx, f)
		if err != nil {
			in.log("fault %s: %v", f.kind, err)
		}
		if !w.Start.IsZero() {
			in.mu.Lock()
			in.faults = append(in.faults, w)
			in.mu.Unlock()
			in.log("fault %-16s %-14s %6.1fs (planned %s)", w.Kind, w.Target, w.End.Sub(w.Start).Seconds(), f.length.Round(100*time.Millisecond))
		}
	}
}

// windows returns the faults injected so far.
func (in *injector) windows() []FaultWindow {
	in.mu.Lock()
	defer in.mu.Unlock()
	return append([]FaultWindow(nil), in.faults...)
}

// awaitRecovery polls ok until it holds or 2 minutes pass; it returns when
// it stopped waiting, the end of the fault's window. Not a test's wait
// (testutil.WaitFor fails a test): a component that does not come back is
// evidence for the invariants, not an error of the harness.
func awaitRecovery(ctx context.Context, ok func() bool) time.Time {
	deadline := time.Now().Add(2 * time.Minute)
	for !ok() && time.Now().Before(deadline) && ctx.Err() == nil {
		sleepCtx(ctx, 100*time.Millisecond)
	}
	return time.Now()
}

// agent is the fault's target: its agent, or for -1 the agent of a
// workspace as last polled (a tenant agent when none holds one).
func (in *injector) agent(f plannedFault) *agentNode {
	if f.agent >= 0 {
		return in.c.agents[f.agent]
	}
	if node := in.ws.holder(); node != "" {
		for _, a := range in.c.agents {
			if a.Node == node {
				return a
			}
		}
	}
	return in.c.agents[processAgents+in.ws.intn(tenantAgents)]
}

func (in *injector) inject(ctx context.Context, f plannedFault) (FaultWindow, error) {
	c := in.c
	set := c.set
	w := FaultWindow{Kind: f.kind}
	// The background context: once injected, a fault is always undone,
	// even when the run's context ended meanwhile.
	bg := context.WithoutCancel(ctx)
	leaderBack := func() bool { return c.leader(bg) != nil }
	switch f.kind {
	case faultControllerKill, faultControllerStop:
		l, err := c.waitLeader(bg, 15*time.Second)
		if err != nil {
			return w, fmt.Errorf("%w; fault skipped", err)
		}
		w.Target = l.Process.Name()
		w.Allowance = set.leaseDuration + 5*time.Second
		w.Start = time.Now()
		if err := disrupt(l.Process, f.kind == faultControllerKill, f.length); err != nil {
			w.End = time.Now()
			return w, err
		}
		w.End = awaitRecovery(bg, leaderBack)
	case faultAgentKill:
		a := in.agent(f)
		w.Target, w.Allowance = a.Node, 5*time.Second
		w.Start = time.Now()
		if err := a.Process.Kill(f.length); err != nil {
			w.End = time.Now()
			return w, err
		}
		w.End = awaitRecovery(bg, func() bool { return httpOK(bg, a.HealthURL) })
	case faultPartition:
		a := in.agent(f)
		w.Target, w.Allowance = a.Node, 5*time.Second
		w.Start = time.Now()
		a.proxy.partition()
		time.Sleep(f.length)
		a.proxy.heal()
		w.End = time.Now()
	case faultAPIServerKill:
		w.Target, w.Allowance = "kube-apiserver", set.leaseDuration+10*time.Second
		w.Start = time.Now()
		if err := c.killAPIServer(f.length); err != nil {
			w.End = time.Now()
			return w, err
		}
		w.End = awaitRecovery(bg, func() bool { return c.apiReady(bg) })
	case faultEtcdStop:
		pid, err := localcluster.ChildPID("etcd")
		if err != nil {
			return w, err
		}
		w.Target, w.Allowance = "etcd", set.leaseDuration+5*time.Second
		w.Start = time.Now()
		if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
			w.End = time.Now()
			return w, err
		}
		time.Sleep(f.length)
		err = syscall.Kill(pid, syscall.SIGCONT)
		w.End = awaitRecovery(bg, func() bool { return c.apiReady(bg) })
		if err != nil {
			return w, err
		}
	case faultAgentStop:
		a := in.agent(f)
		w.Target, w.Allowance = a.Node, 5*time.Second
		w.Start = time.Now()
		if err := a.Process.Signal(syscall.SIGSTOP); err != nil {
			w.End = time.Now()
			return w, err
		}
		time.Sleep(f.length)
		err := a.Process.Signal(syscall.SIGCONT)
		w.End = awaitRecovery(bg, func() bool { return httpOK(bg, a.HealthURL) })
		if err != nil {
			return w, err
		}
	case faultSnapshotS3:
		w.Target, w.Allowance = "versitygw", 5*time.Second
		w.Start = time.Now()
		if err := c.s3.Signal(syscall.SIGSTOP); err != nil {
			w.End = time.Now()
			return w, err
		}
		if len(in.ws.names) > 0 {
			name := in.ws.names[in.ws.intn(len(in.ws.names))]
			w.Target += " (snapshot of " + name + ")"
			if err := in.ws.requestSnapshot(bg, name); err != nil {
				in.log("asking for a snapshot of %s: %v", name, err)
			}
		}
		time.Sleep(f.length)
		err := c.s3.Signal(syscall.SIGCONT)
		w.End = awaitRecovery(bg, func() bool { return c.s3Ready(bg) })
		if err != nil {
			return w, err
		}
	case faultS3Stop, faultS3Kill:
		w.Target, w.Allowance = "versitygw", 5*time.Second
		w.Start = time.Now()
		if err := disrupt(c.s3, f.kind == faultS3Kill, f.length); err != nil {
			w.End = time.Now()
			return w, err
		}
		w.End = awaitRecovery(bg, func() bool { return c.s3Ready(bg) })
	}
	return w, nil
}
