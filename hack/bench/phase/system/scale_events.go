package system

import (
	"context"
	"fmt"
	"math"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	v1 "github.com/bashtask/bashtask-operator/api/v1alpha1"
)

// makeWorkspaces creates n BashWorkspaces with the workers and waits until
// every one is Ready; it returns their names and the seconds from the
// first create to the last Ready seen (polled every 2 s).
func (b *bench) makeWorkspaces(ctx context.Context, o scaleOptions, n int) ([]string, float64, error) {
	names := make([]string, n)
	for i := range names {
		names[i] = fmt.Sprintf("ws-%05d", i)
	}
	fmt.Printf("%d workspaces, %d workers\n", n, o.workers)
	start := time.Now()
	err := runWorkers(ctx, o.workers, names, func(ctx context.Context, name string) error {
		return b.c.Create(ctx, &v1.BashWorkspace{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name}})
	})
	if err != nil {
		return nil, 0, fmt.Errorf("creating workspaces: %w", err)
	}
	created := time.Since(start)
	deadline := start.Add(o.wsTimeout)
	for {
		ready, phases, err := b.workspacePhases(ctx, "")
		if err != nil {
			return nil, 0, err
		}
		if ready == n {
			s := time.Since(start).Seconds()
			fmt.Printf("workspaces: %d created in %s, all Ready %.1f s after the first create\n", n, created.Round(time.Millisecond), s)
			return names, s, nil
		}
		if time.Now().After(deadline) {
			return nil, 0, fmt.Errorf("%d of %d workspaces Ready after %s (phases %v)", ready, n, o.wsTimeout, phases)
		}
		select {
		case <-ctx.Done():
			return nil, 0, ctx.Err()
		case <-time.After(2 * time.Second):
		}
	}
}

// workspacePhases counts the namespace's workspaces by phase, those on node
// only when node is set; ready is the count of the phase wanted (Ready
// without a node, NodeLost with one).
func (b *bench) workspacePhases(ctx context.Context, node string) (counted int, phases map[string]int, err error) {
	phases = map[string]int{}
	var list v1.BashWorkspaceList
	err = listAll(ctx, b.c, &list, func() {
		for i := range list.Items {
			ws := &list.Items[i]
			if node != "" && ptr.Deref(ws.Status.NodeName, "") != node {
				continue
			}
			phases[string(ptr.Deref(ws.Status.Phase, ""))]++
		}
	})
	if node == "" {
		return phases[string(v1.WorkspaceReady)], phases, err
	}
	return phases[string(v1.WorkspaceNodeLost)], phases, err
}

// leaderRestart kills the controller, creates the restart tasks while it
// is down, and measures the new controller process's start to its first
// dispatch: the first Start a simulated agent admits, or, with real
// agents, the first of the tasks the watch sees with a node.
func (sc *scaleCluster) leaderRestart(ctx context.Context, b *bench, o scaleOptions, pt scalePoint, r *scaleRow) error {
	if o.restartTasks <= 0 || len(sc.lc.Controllers) == 0 {
		return nil
	}
	p := sc.lc.Controllers[0].Process
	old := p.PID()
	const down = 5 * time.Second
	if err := p.Kill(down); err != nil {
		return err
	}
	// The new run's start and the agents' Starts are watched from now
	// on, while the tasks are created: no Start comes before the new run.
	sc.mark.Store(time.Now().UnixNano())
	restarted := make(chan time.Time, 1)
	var profiled func()
	go func() {
		for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
			if pid := p.PID(); pid != 0 && pid != old {
				at := time.Now()
				if o.profileDir != "" {
					profiled = sc.profileStart(ctx, b, o.profileDir+"/"+pt.String()+"/restart", o.profileFor)
				}
				restarted <- at
				return
			}
		}
		close(restarted)
	}()
	names := make([]string, o.restartTasks)
	for i := range names {
		names[i] = fmt.Sprintf("r-%05d", i)
	}
	if err := runWorkers(ctx, 16, names, func(ctx context.Context, name string) error {
		return b.createSpec(ctx, name, v1.BashTaskSpec{Command: "true"})
	}); err != nil {
		return fmt.Errorf("restart tasks: %w", err)
	}
	started, ok := <-restarted
	if !ok {
		return fmt.Errorf("the controller did not start again within a minute")
	}
	if err := b.waitTerminal(ctx, names, time.Now().Add(10*time.Minute), "restart"); err != nil {
		return err
	}
	if profiled != nil {
		profiled()
	}
	first := b.firstDispatch(names)
	if pt.simulated {
		first = time.Time{}
		if ns := sc.firstStart.Load(); ns > 0 {
			first = time.Unix(0, ns)
		}
	}
	if first.IsZero() {
		return fmt.Errorf("the restarted controller's first dispatch was not seen")
	}
	r.leaderDispatchS = first.Sub(started).Seconds()
	fmt.Printf("controller restarted with %d tasks pending: start to first dispatch %.2f s (%s)\n", o.restartTasks, r.leaderDispatchS,
		map[bool]string{true: "the first Start RPC a simulated agent admitted", false: "the first task the watch saw with a node"}[pt.simulated])
	return nil
}

// profileStart starts CPU profiles of a restarted controller and the API
// server into dir as soon as the controller's profiler answers (within
// 10 s of its start), for where a new leader's time before its first
// dispatch goes; it returns a function that waits for them.
func (sc *scaleCluster) profileStart(ctx context.Context, b *bench, dir string, d time.Duration) func() {
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		cs := components(sc.dir, sc.cpPIDs)
		for _, c := range cs {
			if c.name == "controller" && c.pprofURL != "" {
				if _, err := httpGet(ctx, c.pprofURL+"/"); err == nil {
					return b.startProfiles(ctx, cs, dir, d)
				}
			}
		}
	}
	fmt.Println("profile of the restarted controller: its profiler did not answer within 10 s")
	return func() {}
}

// firstDispatch is the earliest time the watch saw one of names with a
// node.
func (b *bench) firstDispatch(names []string) time.Time {
	b.mu.Lock()
	defer b.mu.Unlock()
	var first time.Time
	for _, n := range names {
		if t, ok := b.dispatched[n]; ok && (first.IsZero() || t.Before(first)) {
			first = t
		}
	}
	return first
}

// nodeLoss stops node-1's simulated agent, as a node lost at once, and
// measures the time until every workspace on it is NodeLost.
func (sc *scaleCluster) nodeLoss(ctx context.Context, b *bench, o scaleOptions, r *scaleRow) error {
	const node = "node-1"
	sc.mu.Lock()
	a := sc.sims[node]
	sc.mu.Unlock()
	held := a.Workspaces()
	_ = a.Close()
	start := time.Now()
	for deadline := start.Add(o.agentLostAfter + 5*time.Minute); ; {
		lost, phases, err := b.workspacePhases(ctx, node)
		if err != nil {
			return err
		}
		if lost >= held {
			r.nodeLostS = time.Since(start).Seconds()
			fmt.Printf("node %s lost with %d workspaces: all NodeLost after %.1f s (--agent-lost-after %s)\n", node, held, r.nodeLostS, o.agentLostAfter)
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%d of %d workspaces of the lost node %s NodeLost after %s (phases %v)", lost, held, node, time.Since(start).Round(time.Second), phases)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Second):
		}
	}
}

func nan() float64 { return math.NaN() }

func splitLines(s string) []string { return strings.Split(s, "\n") }

func containsAny(s string, subs ...string) bool {
	for _, sub := range subs {
		if strings.Contains(s, sub) {
			return true
		}
	}
	return false
}
