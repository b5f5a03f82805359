package system

import (
	"context"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/bashtask/bashtask-operator/hack/bench/stats"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/bashtask/bashtask-operator/api/v1alpha1"
	btclient "github.com/bashtask/bashtask-operator/client"
)

// workspaceFigures are the workspace phase's results, in milliseconds.
type workspaceFigures struct {
	// createReady are the times from each BashWorkspace's create call to
	// the first watch event that shows it Ready, one workspace at a time.
	createReady []float64
	// inWorkspace and plain are the create-to-terminal latencies of
	// `true` tasks run one at a time, alternately in a workspace and
	// without one.
	inWorkspace, plain []float64
	// copyMBps are the rates of copyRuns downloads of a copyBytes file
	// out of the first workspace, in MB/s.
	copyMBps []float64
}

// copyBytes is the size of the file the copy measure downloads (50 MiB),
// and copyRuns how many times.
const (
	copyBytes = 50 << 20
	copyRuns  = 3
)

// workspacePhase creates n workspaces one after another with the agents'
// defaults (their file system, UID and network), timing each until it is
// Ready; then runs tasks `true` tasks one at a time, alternately in the
// first workspace and plain, so that both see the same load; then deletes
// the workspaces. The bench's task watch gives the terminal times.
func (b *bench) workspacePhase(ctx context.Context, n, tasks int, timeout time.Duration) (workspaceFigures, error) {
	var f workspaceFigures
	w, err := b.c.Watch(ctx, &v1.BashWorkspaceList{}, client.InNamespace(namespace))
	if err != nil {
		return f, fmt.Errorf("watching workspaces: %w", err)
	}
	defer w.Stop()
	var mu sync.Mutex
	ready := map[string]chan struct{}{}
	readyAt := map[string]time.Time{}
	wait := func(name string) chan struct{} {
		mu.Lock()
		defer mu.Unlock()
		ch, ok := ready[name]
		if !ok {
			ch = make(chan struct{})
			ready[name] = ch
		}
		return ch
	}
	go func() {
		for ev := range w.ResultChan() {
			if ev.Type != watch.Added && ev.Type != watch.Modified {
				continue
			}
			ws, ok := ev.Object.(*v1.BashWorkspace)
			if !ok || ptr.Deref(ws.Status.Phase, "") != v1.WorkspaceReady {
				continue
			}
			now := time.Now()
			ch := wait(ws.Name)
			mu.Lock()
			if _, seen := readyAt[ws.Name]; !seen {
				readyAt[ws.Name] = now
				close(ch)
			}
			mu.Unlock()
		}
	}()

	names := make([]string, n)
	for i := range names {
		names[i] = fmt.Sprintf("ws-%04d", i)
		ch := wait(names[i])
		ws := &v1.BashWorkspace{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: names[i]}}
		start := time.Now()
		if err := b.c.Create(ctx, ws); err != nil {
			return f, fmt.Errorf("creating workspace %s: %w", names[i], err)
		}
		select {
		case <-ch:
		case <-time.After(timeout):
			var got v1.BashWorkspace
			_ = b.c.Get(ctx, client.ObjectKeyFromObject(ws), &got)
			return f, fmt.Errorf("workspace %s not Ready after %s: phase %s: %s", names[i], timeout,
				ptr.Deref(got.Status.Phase, ""), ptr.Deref(got.Status.Message, ""))
		case <-ctx.Done():
			return f, ctx.Err()
		}
		mu.Lock()
		f.createReady = append(f.createReady, float64(readyAt[names[i]].Sub(start))/float64(time.Millisecond))
		mu.Unlock()
	}

	for i := 0; i < 2*tasks; i++ {
		name, ws := fmt.Sprintf("wsp-%05d", i), ""
		if i%2 == 0 {
			name, ws = fmt.Sprintf("wst-%05d", i), names[0]
		}
		bt := &v1.BashTask{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace}, Spec: v1.BashTaskSpec{Command: "true"}}
		if ws != "" {
			bt.Spec.Workspace = ptr.To(ws)
		}
		if err := b.c.Create(ctx, bt); err != nil {
			return f, fmt.Errorf("creating %s: %w", name, err)
		}
		b.mu.Lock()
		b.created[name] = time.Now()
		b.mu.Unlock()
		if err := b.waitTerminal(ctx, []string{name}, time.Now().Add(timeout), "workspace"); err != nil {
			return f, err
		}
		b.mu.Lock()
		lat := float64(b.terminal[name].Sub(b.created[name])) / float64(time.Millisecond)
		reason := b.reasons[name]
		b.mu.Unlock()
		if reason != v1.ReasonSucceeded {
			return f, fmt.Errorf("task %s ended %s", name, reason)
		}
		if ws != "" {
			f.inWorkspace = append(f.inWorkspace, lat)
		} else {
			f.plain = append(f.plain, lat)
		}
	}

	if f.copyMBps, err = b.copyOut(ctx, names[0], timeout); err != nil {
		return f, err
	}

	for _, name := range names {
		ws := &v1.BashWorkspace{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name}}
		if err := b.c.Delete(ctx, ws); err != nil {
			return f, fmt.Errorf("deleting workspace %s: %w", name, err)
		}
	}
	// Gone before the next phase: their removal on the agents is not
	// part of what the next phase measures.
	for deadline := time.Now().Add(timeout); ; {
		var list v1.BashWorkspaceList
		if err := b.c.List(ctx, &list, client.InNamespace(namespace)); err != nil {
			return f, err
		}
		if len(list.Items) == 0 {
			return f, nil
		}
		if time.Now().After(deadline) {
			return f, fmt.Errorf("%d workspaces not gone %s after their deletion", len(list.Items), timeout)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// copyOut makes a copyBytes file of random bytes in workspace ws and
// copies it out copyRuns times with the client's CopyFrom (what
// `kubectl bashtask cp` runs), each timed from the call to its return.
func (b *bench) copyOut(ctx context.Context, ws string, timeout time.Duration) ([]float64, error) {
	name := "wscp-make"
	bt := &v1.BashTask{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace},
		Spec: v1.BashTaskSpec{Command: fmt.Sprintf("head -c %d /dev/urandom > cp-bench", copyBytes), Workspace: ptr.To(ws)}}
	if err := b.c.Create(ctx, bt); err != nil {
		return nil, fmt.Errorf("creating %s: %w", name, err)
	}
	b.mu.Lock()
	b.created[name] = time.Now()
	b.mu.Unlock()
	if err := b.waitTerminal(ctx, []string{name}, time.Now().Add(timeout), "workspace"); err != nil {
		return nil, err
	}
	b.mu.Lock()
	reason := b.reasons[name]
	b.mu.Unlock()
	if reason != v1.ReasonSucceeded {
		return nil, fmt.Errorf("task %s ended %s", name, reason)
	}
	dir, err := os.MkdirTemp("", "bench-cp-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	var rates []float64
	for i := range copyRuns {
		dest := filepath.Join(dir, fmt.Sprint(i))
		start := time.Now()
		if err := b.bc.CopyFrom(ctx, namespace, ws, "cp-bench", dest, btclient.CopyOptions{}); err != nil {
			return nil, fmt.Errorf("copying out of workspace %s: %w", ws, err)
		}
		rates = append(rates, copyBytes/time.Since(start).Seconds()/1e6)
		fi, err := os.Stat(dest)
		if err != nil {
			return nil, fmt.Errorf("the copy of workspace %s's file: %w", ws, err)
		}
		if fi.Size() != copyBytes {
			return nil, fmt.Errorf("the copy of workspace %s's file has %d bytes, want %d", ws, fi.Size(), copyBytes)
		}
	}
	return rates, nil
}

// workspaceFigures runs the workspace phase (o.workspaces > 0, agents at
// the tenant level) and puts its figures into f: create-to-Ready p50 and
// p99, task latencies in and out of a workspace, and the copy rate.
// Without the phase they stay NaN.
func (b *bench) workspaceFigures(ctx context.Context, o options, f *figures) error {
	f.wsCreateP50, f.wsCreateP99, f.wsTaskP50, f.wsPlainP50 = math.NaN(), math.NaN(), math.NaN(), math.NaN()
	if o.workspaces <= 0 || o.isolation == "process" {
		return nil
	}
	fmt.Printf("\n== workspaces: %d created one at a time, then %d tasks in one alternating with %d plain ones\n", o.workspaces, o.workspaceTasks, o.workspaceTasks)
	wf, err := b.workspacePhase(ctx, o.workspaces, o.workspaceTasks, time.Minute)
	if err != nil {
		return fmt.Errorf("workspace phase: %w", err)
	}
	f.wsCreateP50, f.wsCreateP99 = stats.Percentile(wf.createReady, 0.50), stats.Percentile(wf.createReady, 0.99)
	f.wsTaskP50, f.wsPlainP50 = stats.Percentile(wf.inWorkspace, 0.50), stats.Percentile(wf.plain, 0.50)
	fmt.Printf("workspace create to Ready: p50 %.1f ms, p99 %.1f ms; a task in a workspace: p50 %.1f ms, a plain task: p50 %.1f ms\n",
		f.wsCreateP50, f.wsCreateP99, f.wsTaskP50, f.wsPlainP50)
	f.wsCopyMBps = stats.Percentile(wf.copyMBps, 0.50)
	fmt.Printf("cp out of a workspace, %d MiB: %s MB/s, median %.1f MB/s\n", copyBytes>>20, joinFloats(wf.copyMBps, "%.1f"), f.wsCopyMBps)
	return nil
}
