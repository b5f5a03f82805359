package main

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/bashtask/bashtask-operator/api/v1alpha1"
)

// recorder watches every BashTask of the namespace from before the first
// is created, keeping each event as received. When the watch breaks (the
// API server was killed, etcd paused) it resumes from the last
// resourceVersion it saw, so no event is lost; if the server no longer has
// that version (410 Gone), the gap is recorded and the state re-read by a
// list.
type recorder struct {
	c  client.WithWatch
	ns string

	mu      sync.Mutex
	events  map[string][]Observation
	byName  map[string]*v1.BashTask
	gaps    []string
	resumes []string
	rv      string
}

func newRecorder(ctx context.Context, c client.WithWatch, ns string) (*recorder, error) {
	r := &recorder{c: c, ns: ns, events: map[string][]Observation{}, byName: map[string]*v1.BashTask{}}
	var list v1.BashTaskList
	if err := c.List(ctx, &list, client.InNamespace(ns)); err != nil {
		return nil, fmt.Errorf("listing BashTasks before the run: %w", err)
	}
	if len(list.Items) != 0 {
		return nil, fmt.Errorf("namespace %s already holds %d BashTasks", ns, len(list.Items))
	}
	r.rv = list.ResourceVersion
	return r, nil
}

// run watches until ctx ends.
func (r *recorder) run(ctx context.Context) {
	for ctx.Err() == nil {
		r.mu.Lock()
		rv := r.rv
		r.mu.Unlock()
		w, err := r.c.Watch(ctx, &v1.BashTaskList{}, client.InNamespace(r.ns),
			&client.ListOptions{Raw: &metav1.ListOptions{ResourceVersion: rv, AllowWatchBookmarks: true}})
		if err != nil {
			if apierrors.IsResourceExpired(err) || apierrors.IsGone(err) {
				r.relist(ctx, rv, err)
			}
			sleepCtx(ctx, 200*time.Millisecond)
			continue
		}
		r.consume(ctx, w, rv)
		w.Stop()
	}
}

func (r *recorder) consume(ctx context.Context, w watch.Interface, startRV string) {
	for {
		select {
		case <-ctx.Done():
			return
		case ev, ok := <-w.ResultChan():
			if !ok {
				return
			}
			switch ev.Type {
			case watch.Error:
				if st, ok := ev.Object.(*metav1.Status); ok && (st.Code == http.StatusGone || st.Reason == metav1.StatusReasonExpired) {
					r.relist(ctx, startRV, fmt.Errorf("%s", st.Message))
				}
				return
			case watch.Bookmark:
				if o, ok := ev.Object.(*v1.BashTask); ok {
					r.mu.Lock()
					r.rv = o.ResourceVersion
					r.mu.Unlock()
				}
			case watch.Added, watch.Modified, watch.Deleted:
				o, ok := ev.Object.(*v1.BashTask)
				if !ok {
					continue
				}
				r.record(string(ev.Type), o)
			}
		}
	}
}

func (r *recorder) record(typ string, o *v1.BashTask) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.events[string(o.UID)] = append(r.events[string(o.UID)], Observation{
		At: time.Now(), Type: typ, ResourceVersion: o.ResourceVersion, Generation: o.Generation, Status: *o.Status.DeepCopy(),
	})
	if typ == "DELETED" {
		delete(r.byName, o.Name)
	} else {
		r.byName[o.Name] = o.DeepCopy()
	}
	r.rv = o.ResourceVersion
}

// relist re-reads the state of every task after the watch could not
// resume (a restarted kube-apiserver's watch cache starts at the current
// revision). A task whose resourceVersion is still the last one the watch
// saw lost nothing; one that changed or vanished meanwhile may have had
// states nobody saw, and is recorded as a gap naming it.
func (r *recorder) relist(ctx context.Context, rv string, cause error) {
	var list v1.BashTaskList
	for ctx.Err() == nil {
		if err := r.c.List(ctx, &list, client.InNamespace(r.ns)); err == nil {
			break
		}
		sleepCtx(ctx, 500*time.Millisecond)
	}
	if ctx.Err() != nil {
		return
	}
	r.mu.Lock()
	r.resumes = append(r.resumes, fmt.Sprintf("watch from rv %s refused (%v); state re-read at rv %s", rv, cause, list.ResourceVersion))
	listed := map[string]bool{}
	var changed []int
	for i := range list.Items {
		o := &list.Items[i]
		uid := string(o.UID)
		listed[uid] = true
		obs := r.events[uid]
		switch {
		case len(obs) == 0:
			r.gaps = append(r.gaps, fmt.Sprintf("task %s appeared while the watch was down (rv %s); its states before are unseen", o.Name, o.ResourceVersion))
			changed = append(changed, i)
		case obs[len(obs)-1].ResourceVersion != o.ResourceVersion:
			r.gaps = append(r.gaps, fmt.Sprintf("task %s changed while the watch was down (rv %s -> %s); states between are unseen",
				o.Name, obs[len(obs)-1].ResourceVersion, o.ResourceVersion))
			changed = append(changed, i)
		}
	}
	for uid, obs := range r.events {
		if last := obs[len(obs)-1]; !listed[uid] && last.Type != "DELETED" {
			r.gaps = append(r.gaps, fmt.Sprintf("task uid %s was deleted while the watch was down (last seen rv %s); its final states are unseen", uid, last.ResourceVersion))
		}
	}
	r.mu.Unlock()
	for _, i := range changed {
		r.record("RELIST", &list.Items[i])
	}
	r.mu.Lock()
	r.rv = list.ResourceVersion
	r.mu.Unlock()
}

// task returns the latest state of the named task, or nil.
func (r *recorder) task(name string) *v1.BashTask {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.byName[name]
}

// firstAdded returns when the watch first saw uid, or the zero time.
func (r *recorder) firstSeen(uid string) time.Time {
	r.mu.Lock()
	defer r.mu.Unlock()
	if obs := r.events[uid]; len(obs) > 0 {
		return obs[0].At
	}
	return time.Time{}
}

// settled reports whether every task of uids is terminal or gone, and each
// terminal one whose output is due has its upload settled; it returns the
// names of those that are not.
func (r *recorder) unsettled(tasks []TaskInfo) []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for _, t := range tasks {
		obs := r.events[t.UID]
		if t.UID == "" || len(obs) == 0 {
			out = append(out, t.Name)
			continue
		}
		last := obs[len(obs)-1]
		if last.Type == "DELETED" {
			continue
		}
		st := last.Status
		if st.Reason == nil {
			out = append(out, t.Name)
			continue
		}
		if uploadDue(t, &st) && !meta.IsStatusConditionTrue(st.Conditions, v1.ConditionOutputUploaded) &&
			ptr.Deref(st.Reason, "") != v1.ReasonAgentLost {
			out = append(out, t.Name)
		}
	}
	return out
}

// snapshot returns a copy of the events, the gaps, and the moments the
// watch had to re-read the state.
func (r *recorder) snapshot() (events map[string][]Observation, gaps, resumes []string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	events = make(map[string][]Observation, len(r.events))
	for k, v := range r.events {
		events[k] = append([]Observation(nil), v...)
	}
	return events, append([]string(nil), r.gaps...), append([]string(nil), r.resumes...)
}

func sleepCtx(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}
