package main

import (
	"context"
	"fmt"
	"sync"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/bashtask/bashtask-operator/api/v1alpha1"
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
}

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
