package system

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/bashtask/bashtask-operator/api/v1alpha1"
	btclient "github.com/bashtask/bashtask-operator/client"
	"github.com/bashtask/bashtask-operator/hack/bench/phase"
	"github.com/bashtask/bashtask-operator/internal/rig/localcluster"
)

// bench is a client of one control plane with a watch on the namespace.
type bench struct {
	c       client.WithWatch
	bc      *btclient.Client
	cs      *kubernetes.Clientset
	cancel  context.CancelFunc
	watchWG sync.WaitGroup

	mu       sync.Mutex
	created  map[string]time.Time // when the create call returned
	terminal map[string]time.Time // when the first terminal event arrived
	// dispatched is when the watch first saw a task with a node.
	dispatched map[string]time.Time
	reasons    map[string]v1.Reason
	samples    map[string][]v1.BashTaskStatus // status sequences of a few throughput tasks
	last       map[string]string              // the last status seen, in short
	stall      time.Duration
	watchErr   error
}

func newBench(ctx context.Context, cfg *rest.Config, o options) (*bench, error) {
	cfg = rest.CopyConfig(cfg)
	cfg.QPS, cfg.Burst = o.qps, o.burst
	c, err := phase.NewClient(cfg)
	if err != nil {
		return nil, err
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	// A client's REST mapper may read an older discovery document on a
	// loaded machine; start once it resolves the kind.
	deadline := time.Now().Add(time.Minute)
	for {
		err := c.List(ctx, &v1.BashTaskList{}, client.Limit(1))
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("BashTasks not served: %w", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace}}); err != nil && !apierrors.IsAlreadyExists(err) {
		return nil, fmt.Errorf("creating namespace %s: %w", namespace, err)
	}
	if err := localcluster.WaitAdmission(ctx, c, namespace); err != nil {
		return nil, err
	}
	bc, err := btclient.New(cfg)
	if err != nil {
		return nil, err
	}
	b := &bench{c: c, cs: cs, bc: bc,
		created: map[string]time.Time{}, terminal: map[string]time.Time{}, dispatched: map[string]time.Time{},
		reasons: map[string]v1.Reason{}, samples: map[string][]v1.BashTaskStatus{},
		last: map[string]string{}, stall: o.stall}
	wctx, cancel := context.WithCancel(ctx)
	b.cancel = cancel
	ready := make(chan struct{})
	b.watchWG.Add(1)
	go b.watch(wctx, ready)
	select {
	case <-ready:
	case <-time.After(time.Minute):
		b.close()
		return nil, errors.New("the watch on BashTasks did not start in a minute")
	}
	return b, nil
}

func (b *bench) close() {
	b.cancel()
	b.watchWG.Wait()
}

// watch follows every BashTask of the namespace until ctx ends, resuming
// from the last resourceVersion seen when the server closes the watch and
// listing again when that version is gone.
func (b *bench) watch(ctx context.Context, ready chan struct{}) {
	defer b.watchWG.Done()
	rv := ""
	first := true
	for ctx.Err() == nil {
		if rv == "" {
			var list v1.BashTaskList
			if err := b.c.List(ctx, &list, client.InNamespace(namespace)); err != nil {
				b.setWatchErr(err)
				time.Sleep(time.Second)
				continue
			}
			now := time.Now()
			for i := range list.Items {
				b.observe(&list.Items[i], now)
			}
			rv = list.ResourceVersion
		}
		w, err := b.c.Watch(ctx, &v1.BashTaskList{}, client.InNamespace(namespace),
			&client.ListOptions{Raw: &metav1.ListOptions{ResourceVersion: rv, AllowWatchBookmarks: true}})
		if err != nil {
			if apierrors.IsResourceExpired(err) || apierrors.IsGone(err) {
				rv = ""
			}
			b.setWatchErr(err)
			time.Sleep(time.Second)
			continue
		}
		if first {
			close(ready)
			first = false
		}
		for ev := range w.ResultChan() {
			now := time.Now()
			if ev.Type == watch.Error {
				if st, ok := ev.Object.(*metav1.Status); ok && (st.Code == 410) {
					rv = ""
				}
				b.setWatchErr(fmt.Errorf("watch error: %v", ev.Object))
				break
			}
			bt, ok := ev.Object.(*v1.BashTask)
			if !ok {
				continue
			}
			rv = bt.ResourceVersion
			if ev.Type != watch.Bookmark && ev.Type != watch.Deleted {
				b.observe(bt, now)
			}
		}
		w.Stop()
	}
}

func (b *bench) setWatchErr(err error) {
	b.mu.Lock()
	b.watchErr = err
	b.mu.Unlock()
}

// observe records the first terminal status of a task, and the sequence
// of statuses of the first few latency tasks.
func (b *bench) observe(bt *v1.BashTask, now time.Time) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if strings.HasPrefix(bt.Name, "lat-0000") {
		if bt.Status.NodeName != nil || bt.Status.Reason != nil {
			seq := b.samples[bt.Name]
			if len(seq) < 8 && (len(seq) == 0 || !statusEqual(seq[len(seq)-1], bt.Status)) && b.terminal[bt.Name].IsZero() {
				b.samples[bt.Name] = append(seq, *bt.Status.DeepCopy())
			}
		}
	}
	if _, ok := b.dispatched[bt.Name]; !ok && bt.Status.NodeName != nil {
		b.dispatched[bt.Name] = now
	}
	b.last[bt.Name] = fmt.Sprintf("phase %q, node %q, reason %q, resourceVersion %s",
		ptr.Deref(bt.Status.Phase, ""), ptr.Deref(bt.Status.NodeName, ""), ptr.Deref(bt.Status.Reason, ""), bt.ResourceVersion)
	if bt.Status.Reason == nil {
		return
	}
	if _, ok := b.terminal[bt.Name]; !ok {
		b.terminal[bt.Name] = now
		b.reasons[bt.Name] = *bt.Status.Reason
	}
}

func statusEqual(a, b v1.BashTaskStatus) bool {
	ja, _ := json.Marshal(a)
	jb, _ := json.Marshal(b)
	return bytes.Equal(ja, jb)
}

func (b *bench) terminalCount() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.terminal)
}

// sampleStatuses returns the status sequence the watch saw for one
// latency task, the one with the most statuses among the sampled.
func (b *bench) sampleStatuses() []v1.BashTaskStatus {
	b.mu.Lock()
	defer b.mu.Unlock()
	var best []v1.BashTaskStatus
	for _, name := range sortedKeys(b.samples) {
		seq := b.samples[name]
		if len(seq) > 0 && seq[len(seq)-1].Reason != nil && len(seq) > len(best) {
			best = seq
		}
	}
	return best
}

func (b *bench) create(ctx context.Context, name string) error {
	bt := &v1.BashTask{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace}, Spec: v1.BashTaskSpec{Command: "true"}}
	if err := b.c.Create(ctx, bt); err != nil {
		return fmt.Errorf("creating %s: %w", name, err)
	}
	now := time.Now()
	b.mu.Lock()
	b.created[name] = now
	b.mu.Unlock()
	return nil
}

// waitTerminal waits until every named task has had a terminal event. It
// fails at the deadline, or earlier when no task of the phase became
// terminal for the stall limit, naming some of the missing tasks and the
// last status the watch saw for each.
func (b *bench) waitTerminal(ctx context.Context, names []string, deadline time.Time, phase string) error {
	lastDone, lastProgress := -1, time.Now()
	for {
		b.mu.Lock()
		var missing []string
		for _, n := range names {
			if _, ok := b.terminal[n]; !ok {
				missing = append(missing, n)
			}
		}
		werr := b.watchErr
		var detail []string
		now := time.Now()
		stalled := now.Sub(lastProgress) > b.stall
		if len(missing) > 0 && (now.After(deadline) || stalled) {
			for _, n := range missing[:min(len(missing), 10)] {
				detail = append(detail, fmt.Sprintf("%s (%s)", n, cmp.Or(b.last[n], "never seen by the watch")))
			}
		}
		b.mu.Unlock()
		if len(missing) == 0 {
			return nil
		}
		if done := len(names) - len(missing); done != lastDone {
			lastDone, lastProgress = done, now
		}
		if detail != nil {
			why := "within the phase limit"
			if stalled {
				why = fmt.Sprintf("and none became terminal for %s", b.stall)
			}
			msg := fmt.Sprintf("%d of %d tasks of the %s phase not terminal %s; among them: %s",
				len(missing), len(names), phase, why, strings.Join(detail, ", "))
			if werr != nil {
				msg += fmt.Sprintf(" (last watch error: %v)", werr)
			}
			return errors.New(msg)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// latencyPhase creates tasks on a ticker, each create in its own goroutine
// so a slow call does not delay the next, and returns the latencies in ms.
func (b *bench) latencyPhase(ctx context.Context, o options) ([]float64, error) {
	deadline := time.Now().Add(o.phaseTimeout)
	names := make([]string, o.latencyTasks)
	for i := range names {
		names[i] = fmt.Sprintf("lat-%05d", i)
	}
	tick := time.NewTicker(time.Duration(float64(time.Second) / o.latencyRate))
	defer tick.Stop()
	var wg sync.WaitGroup
	var firstErr atomic.Value
	for i, name := range names {
		if i > 0 {
			select {
			case <-ctx.Done():
				wg.Wait()
				return nil, ctx.Err()
			case <-tick.C:
			}
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := b.create(ctx, name); err != nil {
				firstErr.CompareAndSwap(nil, err)
			}
		}()
	}
	wg.Wait()
	if err, _ := firstErr.Load().(error); err != nil {
		return nil, err
	}
	if err := b.waitTerminal(ctx, names, deadline, "latency"); err != nil {
		return nil, err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	lat := make([]float64, 0, len(names))
	for _, n := range names {
		d := b.terminal[n].Sub(b.created[n])
		lat = append(lat, max(float64(d)/float64(time.Millisecond), 0))
	}
	return lat, nil
}

// throughputPhase creates n tasks with the workers as fast as they go and
// returns n divided by the time from the first create call to the last
// terminal event.
func (b *bench) throughputPhase(ctx context.Context, o options, prefix string, n int, phase string) (float64, error) {
	deadline := time.Now().Add(o.phaseTimeout)
	names := make([]string, n)
	for i := range names {
		names[i] = fmt.Sprintf("%s%05d", prefix, i)
	}
	start := time.Now()
	if err := runWorkers(ctx, o.workers, names, func(ctx context.Context, name string) error { return b.create(ctx, name) }); err != nil {
		return 0, err
	}
	created := time.Since(start)
	if err := b.waitTerminal(ctx, names, deadline, phase); err != nil {
		return 0, err
	}
	end := b.lastTerminal(names)
	fmt.Printf("%s: %d creates in %s, last terminal %s after the first create\n", phase, n, created.Round(time.Millisecond), end.Sub(start).Round(time.Millisecond))
	return float64(n) / end.Sub(start).Seconds(), nil
}

func (b *bench) lastTerminal(names []string) time.Time {
	b.mu.Lock()
	defer b.mu.Unlock()
	var end time.Time
	for _, n := range names {
		if t := b.terminal[n]; t.After(end) {
			end = t
		}
	}
	return end
}

// printReasons prints the terminal reasons of a phase's tasks when any is
// not Succeeded: a figure of failed tasks measures something else.
func (b *bench) printReasons(prefix string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	counts := map[string]int{}
	for n, r := range b.reasons {
		if strings.HasPrefix(n, prefix) {
			counts[string(r)]++
		}
	}
	if len(counts) == 1 && counts[string(v1.ReasonSucceeded)] > 0 {
		return
	}
	fmt.Printf("WARNING: terminal reasons of %s tasks: %v\n", strings.TrimSuffix(prefix, "-"), counts)
}

// runWorkers calls fn for every name from n goroutines and returns the
// first error; after an error the remaining names are skipped.
func runWorkers(ctx context.Context, n int, names []string, fn func(context.Context, string) error) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var next atomic.Int64
	var wg sync.WaitGroup
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				i := int(next.Add(1)) - 1
				if i >= len(names) {
					return
				}
				if err := fn(ctx, names[i]); err != nil {
					cancel(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	if err := context.Cause(ctx); err != nil && !errors.Is(err, context.Canceled) {
		return err
	}
	return ctx.Err()
}
