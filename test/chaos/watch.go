package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/utils/ptr"

	v1 "github.com/bashtask/bashtask-operator/api/v1alpha1"
)

// recorder watches every BashTask of the namespace from before the first
// is created, keeping each stored state as received. It watches etcd, the
// API server's storage, under the namespace's key prefix (through etcd's
// JSON gateway): that watch sees every write, whoever made it, survives a
// restart of kube-apiserver (whose own watch cache starts again at the
// current revision, so an API watch cannot resume across it) and resumes
// after a pause of etcd from the next revision. Only a compaction of
// revisions it has not seen would lose states; that is recorded as a gap.
type recorder struct {
	etcdURL string
	prefix  string
	hc      *http.Client

	mu     sync.Mutex
	events map[string][]Observation
	byName map[string]*v1.BashTask
	gaps   []string
	rev    int64 // the last revision seen
}

// bashTaskPrefix is where kube-apiserver stores the BashTasks of ns: its
// default --etcd-prefix, then group, resource and namespace.
func bashTaskPrefix(ns string) string {
	return "/registry/" + v1.GroupVersion.Group + "/bashtasks/" + ns + "/"
}

// prefixEnd is the end of the key range of prefix.
func prefixEnd(prefix string) string {
	b := []byte(prefix)
	b[len(b)-1]++
	return string(b)
}

// etcdKV and etcdEvent are etcd's mvccpb messages as its JSON gateway
// writes them: bytes in base64, 64-bit integers as strings, zero values
// left out (a PUT event has no type).
type etcdKV struct {
	Key            []byte `json:"key"`
	Value          []byte `json:"value"`
	CreateRevision int64  `json:"create_revision,string"`
	ModRevision    int64  `json:"mod_revision,string"`
}

type etcdEvent struct {
	Type   string  `json:"type"`
	KV     *etcdKV `json:"kv"`
	PrevKV *etcdKV `json:"prev_kv"`
}

type etcdHeader struct {
	Revision int64 `json:"revision,string"`
}

func newRecorder(ctx context.Context, etcdURL, ns string) (*recorder, error) {
	r := &recorder{etcdURL: strings.TrimSuffix(etcdURL, "/"), prefix: bashTaskPrefix(ns), hc: &http.Client{},
		events: map[string][]Observation{}, byName: map[string]*v1.BashTask{}}
	body, _ := json.Marshal(map[string]any{"key": []byte(r.prefix), "range_end": []byte(prefixEnd(r.prefix)), "count_only": true})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, r.etcdURL+"/v3/kv/range", bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	resp, err := r.hc.Do(req)
	if err != nil {
		return nil, fmt.Errorf("reading %s from etcd at %s: %w", r.prefix, etcdURL, err)
	}
	defer func() { _ = resp.Body.Close() }()
	var out struct {
		Header etcdHeader `json:"header"`
		Count  int64      `json:"count,string"`
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("reading %s from etcd at %s: status %s", r.prefix, etcdURL, resp.Status)
	}
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		return nil, fmt.Errorf("reading %s from etcd at %s: %w", r.prefix, etcdURL, err)
	}
	if out.Count != 0 {
		return nil, fmt.Errorf("etcd already holds %d BashTasks under %s", out.Count, r.prefix)
	}
	if out.Header.Revision == 0 {
		return nil, fmt.Errorf("etcd at %s answered without a revision", etcdURL)
	}
	r.rev = out.Header.Revision
	return r, nil
}

// run watches until ctx ends.
func (r *recorder) run(ctx context.Context) {
	for ctx.Err() == nil {
		if err := r.watchOnce(ctx); err != nil && ctx.Err() == nil {
			sleepCtx(ctx, 200*time.Millisecond)
		}
	}
}

// watchOnce opens one watch stream from the revision after the last seen
// and records its events until the stream ends.
func (r *recorder) watchOnce(ctx context.Context) error {
	r.mu.Lock()
	from := r.rev + 1
	r.mu.Unlock()
	body, _ := json.Marshal(map[string]any{"create_request": map[string]any{
		"key": []byte(r.prefix), "range_end": []byte(prefixEnd(r.prefix)), "start_revision": strconv.FormatInt(from, 10), "prev_kv": true,
	}})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, r.etcdURL+"/v3/watch", bytes.NewReader(body))
	if err != nil {
		return err
	}
	resp, err := r.hc.Do(req)
	if err != nil {
		return err
	}
	defer func() { _ = resp.Body.Close() }()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("etcd watch: %s", resp.Status)
	}
	dec := json.NewDecoder(resp.Body)
	for {
		var msg struct {
			Result struct {
				Header          etcdHeader  `json:"header"`
				CompactRevision int64       `json:"compact_revision,string"`
				Canceled        bool        `json:"canceled"`
				CancelReason    string      `json:"cancel_reason"`
				Events          []etcdEvent `json:"events"`
			} `json:"result"`
			Error *struct {
				Message string `json:"message"`
			} `json:"error"`
		}
		if err := dec.Decode(&msg); err != nil {
			return err
		}
		if msg.Error != nil {
			return fmt.Errorf("etcd watch: %s", msg.Error.Message)
		}
		res := msg.Result
		if res.CompactRevision != 0 {
			r.mu.Lock()
			r.gaps = append(r.gaps, fmt.Sprintf("etcd compacted revisions %d to %d before the watch saw them", from, res.CompactRevision))
			r.rev = res.CompactRevision - 1
			r.mu.Unlock()
			return nil
		}
		if res.Canceled {
			return fmt.Errorf("etcd watch cancelled: %s", res.CancelReason)
		}
		for _, ev := range res.Events {
			r.recordEvent(ev)
		}
	}
}

func (r *recorder) recordEvent(ev etcdEvent) {
	if ev.KV == nil {
		return
	}
	kv, typ := ev.KV, "MODIFIED"
	rev := ev.KV.ModRevision
	switch {
	case ev.Type == "DELETE":
		typ = "DELETED"
		kv = ev.PrevKV
	case ev.KV.CreateRevision == ev.KV.ModRevision:
		typ = "ADDED"
	}
	if kv == nil {
		r.mu.Lock()
		r.gaps = append(r.gaps, fmt.Sprintf("key %s deleted at revision %d without its last value", ev.KV.Key, rev))
		r.rev = rev
		r.mu.Unlock()
		return
	}
	var o v1.BashTask
	if err := json.Unmarshal(kv.Value, &o); err != nil {
		r.mu.Lock()
		r.gaps = append(r.gaps, fmt.Sprintf("value of %s at revision %d unreadable: %v", kv.Key, rev, err))
		r.rev = rev
		r.mu.Unlock()
		return
	}
	// The stored object carries no resourceVersion: it is the revision.
	o.ResourceVersion = strconv.FormatInt(rev, 10)
	r.record(typ, &o, rev)
}

func (r *recorder) record(typ string, o *v1.BashTask, rev int64) {
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
	r.rev = rev
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

// snapshot returns a copy of the events and the gaps.
func (r *recorder) snapshot() (events map[string][]Observation, gaps []string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	events = make(map[string][]Observation, len(r.events))
	for k, v := range r.events {
		events[k] = append([]Observation(nil), v...)
	}
	return events, slices.Clone(r.gaps)
}

func sleepCtx(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}
