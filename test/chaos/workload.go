package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/bashtask/bashtask-operator/api/v1alpha1"
)

// Workload kinds.
const (
	kindShort   = "short"
	kindLong    = "long"
	kindBigOut  = "bigout"
	kindCancel  = "cancel"
	kindDelete  = "delete"
	kindTimeout = "timeout"
	kindValue   = "valuefrom"
	kindOwner   = "owner"
	// kindWorkspace tasks run in the workload's workspaces (workspaces.go).
	kindWorkspace = "workspace"
)

// plannedTask is one task of the workload, decided from the seed before
// the run.
type plannedTask struct {
	name   string
	kind   string
	at     time.Duration // creation, from the start of the workload
	script string        // the command after the start record
	// timeout and grace in seconds (spec values).
	timeout, grace int32
	owner          string
	// valueFrom: the ConfigMap or Secret the env entry references, and for
	// a late one the delay after which the harness creates it.
	refKind, refName string
	refLate          time.Duration
	// stopAfter is, for cancel and delete tasks, how long after the task
	// was seen Running the harness cancels or deletes it.
	stopAfter    time.Duration
	expectUpload bool
}

// planWorkload decides every task of a run of length d at rate tasks per
// second.
func planWorkload(rng *rand.Rand, d time.Duration, rate float64) []plannedTask {
	var out []plannedTask
	n := int(d.Seconds() * rate)
	for i := range n {
		p := plannedTask{
			name:    fmt.Sprintf("t%04d", i),
			at:      time.Duration(rng.Float64() * float64(d)),
			timeout: 120, grace: 3,
		}
		switch x := rng.IntN(100); {
		case x < 38:
			p.kind = kindShort
			p.script = []string{"true", "echo hello", "exit 3", "kill -TERM $$", "printf 'x%.0s' $(seq 1000); echo", "echo out; echo err >&2"}[rng.IntN(6)]
		case x < 52:
			p.kind = kindLong
			p.script = fmt.Sprintf("echo begin; sleep %d; echo end", 10+rng.IntN(51))
		case x < 62:
			p.kind = kindBigOut
			lines := 100000 + rng.IntN(200001) // 19 bytes a line: 1.9 to 5.7 MB
			p.script = fmt.Sprintf("seq -f 'chaos-%%012.0f' 1 %d", lines)
			p.expectUpload = true
		case x < 68:
			p.kind = kindCancel
			p.script = "echo armed; sleep 300"
			p.timeout = 600
			p.stopAfter = time.Duration(500+rng.IntN(5000)) * time.Millisecond
		case x < 72:
			p.kind = kindDelete
			p.script = "echo armed; sleep 300"
			p.timeout = 600
			p.stopAfter = time.Duration(500+rng.IntN(5000)) * time.Millisecond
		case x < 82:
			p.kind = kindTimeout
			p.timeout = int32(2 + rng.IntN(5))
			p.grace = int32(1 + rng.IntN(3))
			p.script = "echo started; sleep 60"
			if rng.IntN(2) == 0 {
				p.script = "trap '' TERM; echo started; sleep 60"
			}
		case x < 92:
			p.kind = kindValue
			switch rng.IntN(3) {
			case 0:
				p.refKind, p.refName = "Secret", "chaos-secret"
			case 1:
				p.refKind, p.refName = "ConfigMap", "chaos-config"
			default:
				p.refKind, p.refName = "ConfigMap", "late-"+p.name
				p.refLate = time.Duration(2000+rng.IntN(8000)) * time.Millisecond
			}
			p.script = `test -n "$CHAOS_VALUE" && echo "value=$CHAOS_VALUE"`
		default:
			p.kind = kindOwner
			p.owner = fmt.Sprintf("chaos-owner-%d", 1+rng.IntN(3))
			p.script = fmt.Sprintf("echo owned; sleep %d", 2+rng.IntN(7))
		}
		out = append(out, p)
	}
	// Creation order is time order.
	for i := 1; i < len(out); i++ {
		for j := i; j > 0 && out[j].at < out[j-1].at; j-- {
			out[j], out[j-1] = out[j-1], out[j]
		}
	}
	for i := range out {
		out[i].name = fmt.Sprintf("t%04d-%s", i, out[i].kind)
		if out[i].refLate > 0 {
			out[i].refName = "late-" + out[i].name
		}
	}
	return out
}

// workload creates the planned tasks at their times and cancels or deletes
// those meant to be, retrying every call through the faults.
type workload struct {
	c         client.Client
	ns        string
	runID     string
	startsDir string
	rec       *recorder
	log       func(string, ...any)

	mu    sync.Mutex
	tasks map[string]*TaskInfo // by name
	order []string
	wg    sync.WaitGroup
}

func (w *workload) spec(p plannedTask) *v1.BashTask {
	// The command records its own start first (one line per run, in a
	// file per task UID), then runs the workload's script.
	cmd := fmt.Sprintf(`echo "$BASHTASK_UID $BASHTASK_NODE $$" >> %s/$BASHTASK_UID; %s`, w.startsDir, p.script)
	bt := &v1.BashTask{
		ObjectMeta: metav1.ObjectMeta{Namespace: w.ns, Name: p.name, Labels: map[string]string{"chaos.bashtask.dev/kind": p.kind}},
		Spec: v1.BashTaskSpec{
			Command:                cmd,
			TimeoutSeconds:         ptr.To(p.timeout),
			KillGracePeriodSeconds: ptr.To(p.grace),
			Env:                    []v1.EnvVar{{Name: "CHAOS_RUN", Value: ptr.To(w.runID)}},
			// The process agents: their commands can write start records.
			NodeSelector: map[string]string{poolLabel: "process"},
		},
	}
	if p.owner != "" {
		bt.Spec.Owner = ptr.To(p.owner)
	}
	if p.refName != "" {
		sel := &v1.KeySelector{Name: p.refName, Key: "value"}
		src := &v1.ValueSource{ConfigMapKeyRef: sel}
		if p.refKind == "Secret" {
			src = &v1.ValueSource{SecretKeyRef: sel}
		}
		bt.Spec.Env = append(bt.Spec.Env, v1.EnvVar{Name: "CHAOS_VALUE", ValueFrom: src})
	}
	return bt
}

// prepare creates the namespace and the values the tasks reference from
// the start.
func (w *workload) prepare(ctx context.Context) error {
	objs := []client.Object{
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: w.ns}},
		&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: w.ns, Name: "chaos-secret"}, StringData: map[string]string{"value": "from-secret"}},
		&corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: w.ns, Name: "chaos-config"}, Data: map[string]string{"value": "from-configmap"}},
	}
	for _, o := range objs {
		if err := w.c.Create(ctx, o); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("creating %T %s: %w", o, o.GetName(), err)
		}
	}
	return nil
}

// retry calls f until it succeeds or ctx ends.
func retry(ctx context.Context, f func() error) error {
	for {
		err := f()
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w (last error: %w)", ctx.Err(), err)
		case <-time.After(300 * time.Millisecond):
		}
	}
}

// run creates the plan's tasks at their times until schedule ends; the
// calls for each task (create, cancel, delete) go on until calls ends.
func (w *workload) run(schedule, calls context.Context, plan []plannedTask, start time.Time) {
	for _, p := range plan {
		select {
		case <-schedule.Done():
			return
		case <-time.After(time.Until(start.Add(p.at))):
		}
		w.wg.Go(func() { w.one(calls, p) })
	}
}

// created registers the task with what the harness knows of it (ti),
// creates bt and reads its UID, retrying through the faults; nil when
// the task could not be created before ctx ended.
func (w *workload) created(ctx context.Context, bt *v1.BashTask, ti TaskInfo) *TaskInfo {
	info := &ti
	name := bt.Name
	w.mu.Lock()
	w.tasks[name] = info
	w.order = append(w.order, name)
	w.mu.Unlock()

	err := retry(ctx, func() error {
		err := w.c.Create(ctx, bt.DeepCopy())
		if apierrors.IsAlreadyExists(err) {
			// An earlier attempt went through although its answer was
			// lost (the API server died mid-call).
			return nil
		}
		return err
	})
	created := time.Now()
	if err != nil {
		w.log("creating %s: %v", name, err)
		return nil
	}
	var got v1.BashTask
	if err := retry(ctx, func() error { return w.c.Get(ctx, client.ObjectKeyFromObject(bt), &got) }); err != nil {
		w.log("reading %s: %v", name, err)
		return nil
	}
	uid := string(got.UID)
	if seen := w.rec.firstSeen(uid); !seen.IsZero() && seen.Before(created) {
		created = seen
	}
	w.mu.Lock()
	info.UID, info.Created = uid, created
	w.mu.Unlock()
	return info
}

func (w *workload) one(ctx context.Context, p plannedTask) {
	info := w.created(ctx, w.spec(p), TaskInfo{Name: p.name, Kind: p.kind, OwnerLimited: p.owner != "",
		Timeout: time.Duration(p.timeout) * time.Second, Grace: time.Duration(p.grace) * time.Second, ExpectUpload: p.expectUpload})
	if info == nil {
		return
	}
	created := info.Created

	if p.refLate > 0 {
		sleepCtx(ctx, time.Until(created.Add(p.refLate)))
		cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: w.ns, Name: p.refName}, Data: map[string]string{"value": "late"}}
		if err := retry(ctx, func() error {
			err := w.c.Create(ctx, cm.DeepCopy())
			if apierrors.IsAlreadyExists(err) {
				return nil
			}
			return err
		}); err != nil {
			w.log("creating %s: %v", p.refName, err)
			return
		}
		w.mu.Lock()
		info.ReadyAt = time.Now()
		w.mu.Unlock()
	}

	if p.stopAfter > 0 {
		w.stop(ctx, p, info)
	}
}

// stop cancels or deletes a task once it has been seen Running for
// p.stopAfter. A task that ended first is left alone.
func (w *workload) stop(ctx context.Context, p plannedTask, info *TaskInfo) {
	for {
		t := w.rec.task(p.name)
		if t != nil && t.Status.Reason != nil {
			return
		}
		if t != nil && ptr.Deref(t.Status.Phase, "") == v1.PhaseRunning {
			break
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(200 * time.Millisecond):
		}
	}
	sleepCtx(ctx, p.stopAfter)
	key := client.ObjectKey{Namespace: w.ns, Name: p.name}
	var err error
	if p.kind == kindDelete {
		w.mu.Lock()
		info.Deleted = true
		w.mu.Unlock()
		err = retry(ctx, func() error {
			err := w.c.Delete(ctx, &v1.BashTask{ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: key.Name, UID: "", ResourceVersion: ""}},
				client.Preconditions{UID: ptrUID(info.UID)})
			if apierrors.IsNotFound(err) {
				return nil
			}
			return err
		})
	} else {
		err = retry(ctx, func() error {
			patch := []byte(`{"spec":{"cancelRequested":true}}`)
			return w.c.Patch(ctx, &v1.BashTask{ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: key.Name}}, client.RawPatch("application/merge-patch+json", patch))
		})
	}
	if err != nil {
		w.log("stopping %s: %v", p.name, err)
	}
}

// infos returns what the workload knows of every task, in creation order.
func (w *workload) infos() []TaskInfo {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := make([]TaskInfo, 0, len(w.order))
	for _, n := range w.order {
		out = append(out, *w.tasks[n])
	}
	return out
}

func ptrUID(uid string) *types.UID {
	u := types.UID(uid)
	return &u
}
