package main

import (
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	v1 "github.com/bashtask/bashtask-operator/api/v1alpha1"
)

// This file holds the invariant checker: pure functions from the evidence
// collected during a run to one result per invariant. Nothing here reads
// the cluster, so the unit tests feed it synthetic evidence.

// TaskInfo is what the harness itself knows about a task it created.
type TaskInfo struct {
	// Name and UID identify the task; UID is empty when the create never
	// succeeded.
	Name, UID string
	// Kind is the workload kind (short, long, bigout, ...).
	Kind string
	// Created is when the task was known to exist: the earlier of the
	// create call's return and the watch's ADDED event.
	Created time.Time
	// ReadyAt is when the last value the task references was created; zero
	// when it references none that came later than the task.
	ReadyAt time.Time
	// OwnerLimited is true when the task has an owner subject to the
	// controller's --max-running-per-owner: it may wait for other tasks of
	// its owner, so its deadline counts from its dispatch.
	OwnerLimited bool
	// Timeout and Grace are spec.timeoutSeconds and
	// spec.killGracePeriodSeconds (with their defaults).
	Timeout, Grace time.Duration
	// Deleted is true when the harness deleted the task.
	Deleted bool
	// ExpectUpload is true when the command, run to success, writes more
	// than a tail holds, so its output is due for upload.
	ExpectUpload bool
}

// Observation is one watch event of a task, as received.
type Observation struct {
	// At is when the harness received the event.
	At time.Time
	// Type is ADDED, MODIFIED or DELETED.
	Type string
	// ResourceVersion of the object: the etcd revision of the write.
	ResourceVersion string
	// Generation is metadata.generation.
	Generation int64
	// Status is the object's status.
	Status v1.BashTaskStatus
}

// StartRecord is one piece of evidence that a task's command started.
type StartRecord struct {
	// Node and PID identify the shell process.
	Node string
	PID  int
	// Source says where the record comes from: "agent log" or "command".
	Source string
}

// ObjectInfo is an object read from the bucket.
type ObjectInfo struct {
	// Size in bytes and lowercase hex SHA-256 of the content.
	Size   int64
	SHA256 string
	// Err is set when the object could not be read.
	Err string
}

// FaultWindow is one injected fault.
type FaultWindow struct {
	// Kind (controller-kill, etcd-stop, ...) and Target (a component).
	Kind, Target string
	// Start is the injection; End is when the harness saw the component
	// serve again.
	Start, End time.Time
	// Allowance is the extra time the system needs after End to catch up
	// (a lease to expire, a watch to resync).
	Allowance time.Duration
}

// Evidence is everything the checker reads.
type Evidence struct {
	// Tasks are the tasks the harness created, in creation order.
	Tasks []TaskInfo
	// Events are the watch observations per task UID, in arrival order.
	Events map[string][]Observation
	// WatchGaps describe revisions the watch did not see (compacted
	// before it read them); any gap makes the watch-based checks unsound.
	WatchGaps []string
	// Starts are the start records per task UID.
	Starts map[string][]StartRecord
	// Objects are the bucket's objects by the URL the status names.
	Objects map[string]ObjectInfo
	// LiveProcesses are the pids of task processes alive at the end, per
	// task UID.
	LiveProcesses map[string][]int
	// AgentRecords are the task UIDs each agent holds at the end, by node.
	AgentRecords map[string][]string
	// AgentRecordsErr names agents whose records could not be read.
	AgentRecordsErr map[string]string
	// Existing are the UIDs of the BashTasks that exist at the end.
	Existing map[string]bool
	// Faults are the injected faults.
	Faults []FaultWindow
	// AgentLostAfter is the controller's --agent-lost-after.
	AgentLostAfter time.Duration
	// Slack is added to every deadline for dispatch and the machine's load.
	Slack time.Duration
	// End is when the evidence was taken.
	End time.Time
	// Beacon are the lines the workspaces' tasks sent, in arrival order.
	Beacon []BeaconLine
	// Workspaces are the polls of each workspace's status, by name.
	Workspaces map[string][]WorkspaceObservation
	// Snapshots are the snapshot objects the polls name, by URL.
	Snapshots map[string]SnapshotInfo
}

// Violation is one failed check of one task.
type Violation struct {
	// Task is namespace-less task name (or a component for evidence rows).
	Task string
	// UID of the task, when known.
	UID string
	// Evidence says what was seen.
	Evidence string
}

// Result is the outcome of one invariant.
type Result struct {
	// ID is a short label (1a, 1b, ...) and Name the invariant's text.
	ID, Name string
	// Checked counts the tasks (or items) the invariant applied to.
	Checked int
	// Violations found.
	Violations []Violation
	// Note carries a figure worth printing beside the row (the worst
	// deadline margin).
	Note string
}

// Failed reports whether any result has a violation.
func Failed(results []Result) bool {
	for _, r := range results {
		if len(r.Violations) > 0 {
			return true
		}
	}
	return false
}

// Check evaluates every invariant on e.
func Check(e *Evidence) []Result {
	return []Result{
		checkWatchComplete(e),
		checkStartedAtMostOnce(e),
		checkFinishedStartedOnce(e),
		checkOneTerminalReason(e),
		checkTerminalFieldsFixed(e),
		checkObservedGeneration(e),
		checkNoPhaseRegression(e),
		checkUploadedObjects(e),
		checkUploadsDone(e),
		checkNoLiveProcesses(e),
		checkNoOrphanRecords(e),
		checkDeadlines(e),
		checkOneCopyRuns(e),
		checkNoOlderFiles(e),
	}
}

func (t TaskInfo) label() string { return t.Name }

func checkWatchComplete(e *Evidence) Result {
	r := Result{ID: "0", Name: "evidence: the watch saw every stored state of every task (no gap)", Checked: 1}
	for _, g := range e.WatchGaps {
		r.Violations = append(r.Violations, Violation{Task: "watch", Evidence: g})
	}
	for _, t := range e.Tasks {
		if t.UID != "" && len(e.Events[t.UID]) == 0 {
			r.Violations = append(r.Violations, Violation{Task: t.label(), UID: t.UID, Evidence: "the watch never saw this task"})
		}
	}
	return r
}

// distinctStarts groups start records by process (node and pid).
func distinctStarts(recs []StartRecord) []string {
	by := map[string][]string{}
	for _, s := range recs {
		k := fmt.Sprintf("%s pid %d", s.Node, s.PID)
		if !slices.Contains(by[k], s.Source) {
			by[k] = append(by[k], s.Source)
		}
	}
	out := make([]string, 0, len(by))
	for k, srcs := range by {
		sort.Strings(srcs)
		out = append(out, fmt.Sprintf("%s [%s]", k, strings.Join(srcs, ", ")))
	}
	sort.Strings(out)
	return out
}

func checkStartedAtMostOnce(e *Evidence) Result {
	r := Result{ID: "1a", Name: "every task started at most once in the whole cluster"}
	for _, t := range e.Tasks {
		if t.UID == "" {
			continue
		}
		r.Checked++
		if s := distinctStarts(e.Starts[t.UID]); len(s) > 1 {
			r.Violations = append(r.Violations, Violation{Task: t.label(), UID: t.UID,
				Evidence: fmt.Sprintf("started %d times: %s", len(s), strings.Join(s, "; "))})
		}
	}
	return r
}

// finalStatus returns the last observed status of uid, or nil.
func finalStatus(e *Evidence, uid string) *v1.BashTaskStatus {
	obs := e.Events[uid]
	if len(obs) == 0 {
		return nil
	}
	return &obs[len(obs)-1].Status
}

// firstTerminal returns the index of the first observation with a terminal
// reason, or -1.
func firstTerminal(obs []Observation) int {
	for i, o := range obs {
		if o.Status.Reason != nil {
			return i
		}
	}
	return -1
}

func checkFinishedStartedOnce(e *Evidence) Result {
	r := Result{ID: "1b", Name: "a task reported Succeeded, NonZeroExit or Signaled started exactly once"}
	for _, t := range e.Tasks {
		st := finalStatus(e, t.UID)
		if st == nil || st.Reason == nil {
			continue
		}
		switch *st.Reason {
		case v1.ReasonSucceeded, v1.ReasonNonZeroExit, v1.ReasonSignaled:
		default:
			continue
		}
		r.Checked++
		if s := distinctStarts(e.Starts[t.UID]); len(s) != 1 {
			r.Violations = append(r.Violations, Violation{Task: t.label(), UID: t.UID,
				Evidence: fmt.Sprintf("reported %s but started %d times: %s", *st.Reason, len(s), strings.Join(s, "; "))})
		}
	}
	return r
}

func reasonString(r *v1.Reason) string {
	if r == nil {
		return "<none>"
	}
	return string(*r)
}

func checkOneTerminalReason(e *Evidence) Result {
	r := Result{ID: "2a", Name: "every task reaches exactly one terminal reason"}
	for _, t := range e.Tasks {
		if t.UID == "" {
			continue
		}
		obs := e.Events[t.UID]
		if deletedBeforeDispatch(t, obs) {
			continue
		}
		r.Checked++
		i := firstTerminal(obs)
		if i < 0 {
			last := "never observed"
			if len(obs) > 0 {
				o := obs[len(obs)-1]
				last = fmt.Sprintf("last seen %s (rv %s): phase %s, node %s, conditions %s", o.Type, o.ResourceVersion,
					ptr.Deref(o.Status.Phase, "<none>"), ptr.Deref(o.Status.NodeName, "<none>"), conditionSummary(o.Status.Conditions))
			}
			r.Violations = append(r.Violations, Violation{Task: t.label(), UID: t.UID, Evidence: "no terminal reason: " + last})
			continue
		}
		first := *obs[i].Status.Reason
		for _, o := range obs[i+1:] {
			if o.Status.Reason == nil || *o.Status.Reason != first {
				r.Violations = append(r.Violations, Violation{Task: t.label(), UID: t.UID,
					Evidence: fmt.Sprintf("reason %s (rv %s) became %s (rv %s)", first, obs[i].ResourceVersion, reasonString(o.Status.Reason), o.ResourceVersion)})
				break
			}
		}
	}
	return r
}

func timeString(t *metav1.Time) string {
	if t == nil {
		return "<none>"
	}
	return t.UTC().Format(time.RFC3339)
}

func int32String(p *int32) string {
	if p == nil {
		return "<none>"
	}
	return fmt.Sprint(*p)
}

func sameTime(a, b *metav1.Time) bool {
	if a == nil || b == nil {
		return a == nil && b == nil
	}
	return a.Equal(b)
}

// deletedBeforeDispatch reports whether the harness deleted the task before
// any agent got it: it then ends without a reason.
func deletedBeforeDispatch(t TaskInfo, obs []Observation) bool {
	if !t.Deleted || len(obs) == 0 {
		return false
	}
	last := obs[len(obs)-1]
	return last.Type == "DELETED" && last.Status.NodeName == nil && last.Status.Reason == nil
}

func checkTerminalFieldsFixed(e *Evidence) Result {
	r := Result{ID: "2b", Name: "after the terminal reason, exitCode, startTime and completionTime never change"}
	for _, t := range e.Tasks {
		obs := e.Events[t.UID]
		i := firstTerminal(obs)
		if i < 0 {
			continue
		}
		r.Checked++
		ref := obs[i].Status
		for _, o := range obs[i+1:] {
			var diffs []string
			if !ptr.Equal(ref.ExitCode, o.Status.ExitCode) {
				diffs = append(diffs, fmt.Sprintf("exitCode %s -> %s", int32String(ref.ExitCode), int32String(o.Status.ExitCode)))
			}
			if !sameTime(ref.StartTime, o.Status.StartTime) {
				diffs = append(diffs, fmt.Sprintf("startTime %s -> %s", timeString(ref.StartTime), timeString(o.Status.StartTime)))
			}
			if !sameTime(ref.CompletionTime, o.Status.CompletionTime) {
				diffs = append(diffs, fmt.Sprintf("completionTime %s -> %s", timeString(ref.CompletionTime), timeString(o.Status.CompletionTime)))
			}
			if len(diffs) > 0 {
				r.Violations = append(r.Violations, Violation{Task: t.label(), UID: t.UID,
					Evidence: fmt.Sprintf("terminal at rv %s, then at rv %s: %s", obs[i].ResourceVersion, o.ResourceVersion, strings.Join(diffs, ", "))})
				break
			}
		}
	}
	return r
}

func checkObservedGeneration(e *Evidence) Result {
	r := Result{ID: "2c", Name: "observedGeneration never decreases"}
	for _, t := range e.Tasks {
		obs := e.Events[t.UID]
		if len(obs) == 0 {
			continue
		}
		r.Checked++
		var prev *int64
		prevRV := ""
		for _, o := range obs {
			cur := o.Status.ObservedGeneration
			if prev != nil && (cur == nil || *cur < *prev) {
				got := "<none>"
				if cur != nil {
					got = fmt.Sprint(*cur)
				}
				r.Violations = append(r.Violations, Violation{Task: t.label(), UID: t.UID,
					Evidence: fmt.Sprintf("observedGeneration %d (rv %s) then %s (rv %s)", *prev, prevRV, got, o.ResourceVersion)})
				break
			}
			if cur != nil {
				prev, prevRV = cur, o.ResourceVersion
			}
		}
	}
	return r
}

func terminalPhase(p v1.Phase) bool { return p == v1.PhaseSucceeded || p == v1.PhaseFailed }

func checkNoPhaseRegression(e *Evidence) Result {
	r := Result{ID: "2d", Name: "no task goes back from Running to Pending or from a terminal phase to any other"}
	for _, t := range e.Tasks {
		obs := e.Events[t.UID]
		if len(obs) == 0 {
			continue
		}
		r.Checked++
		var prev v1.Phase
		prevRV := ""
		for _, o := range obs {
			cur := ptr.Deref(o.Status.Phase, "")
			bad := false
			switch {
			case prev == "":
			case terminalPhase(prev):
				bad = cur != prev
			case prev == v1.PhaseRunning:
				bad = cur != v1.PhaseRunning && !terminalPhase(cur)
			}
			if bad {
				shown := string(cur)
				if cur == "" {
					shown = "<none>"
				}
				r.Violations = append(r.Violations, Violation{Task: t.label(), UID: t.UID,
					Evidence: fmt.Sprintf("phase %s (rv %s) then %s (rv %s)", prev, prevRV, shown, o.ResourceVersion)})
				break
			}
			if cur != "" || prev != "" {
				prev, prevRV = cur, o.ResourceVersion
			}
		}
	}
	return r
}

func conditionSummary(cs []metav1.Condition) string {
	parts := make([]string, 0, len(cs))
	for _, c := range cs {
		parts = append(parts, fmt.Sprintf("%s=%s/%s", c.Type, c.Status, c.Reason))
	}
	return strings.Join(parts, " ")
}

// streams returns the named stream statuses of st that are set.
func streams(st *v1.BashTaskStatus) map[string]*v1.StreamStatus {
	out := map[string]*v1.StreamStatus{}
	if st.Stdout != nil {
		out["stdout"] = st.Stdout
	}
	if st.Stderr != nil {
		out["stderr"] = st.Stderr
	}
	return out
}

func checkUploadedObjects(e *Evidence) Result {
	r := Result{ID: "3a", Name: "OutputUploaded=True: the objects' size and sha256 equal the status"}
	for _, t := range e.Tasks {
		st := finalStatus(e, t.UID)
		if st == nil || !meta.IsStatusConditionTrue(st.Conditions, v1.ConditionOutputUploaded) {
			continue
		}
		r.Checked++
		for _, name := range []string{"stdout", "stderr"} {
			s := streams(st)[name]
			if s == nil || s.Spill == nil || s.Spill.URL == nil {
				continue
			}
			url := *s.Spill.URL
			obj, ok := e.Objects[url]
			var problem string
			switch {
			case !ok:
				problem = "object not read"
			case obj.Err != "":
				problem = "object unreadable: " + obj.Err
			case obj.Size != ptr.Deref(s.Spill.Bytes, -1):
				problem = fmt.Sprintf("object holds %d bytes, status spill.bytes %d", obj.Size, ptr.Deref(s.Spill.Bytes, -1))
			case ptr.Deref(s.Spill.Complete, false) && obj.Size != ptr.Deref(s.TotalBytes, -1):
				problem = fmt.Sprintf("object holds %d bytes, status totalBytes %d with spill complete", obj.Size, ptr.Deref(s.TotalBytes, -1))
			case ptr.Deref(s.Spill.Complete, false) && obj.SHA256 != ptr.Deref(s.SHA256, ""):
				problem = fmt.Sprintf("object sha256 %s, status sha256 %s", obj.SHA256, ptr.Deref(s.SHA256, ""))
			}
			if problem != "" {
				r.Violations = append(r.Violations, Violation{Task: t.label(), UID: t.UID, Evidence: fmt.Sprintf("%s %s: %s", name, url, problem)})
			}
		}
	}
	return r
}

// uploadDue reports whether a task's output was due for upload: a stream
// the status says is not whole in its tail, or a command the harness knows
// writes more than a tail and that ran to success.
func uploadDue(t TaskInfo, st *v1.BashTaskStatus) bool {
	for _, s := range streams(st) {
		if ptr.Deref(s.Truncated, false) {
			return true
		}
	}
	return t.ExpectUpload && ptr.Deref(st.Reason, "") == v1.ReasonSucceeded
}

func checkUploadsDone(e *Evidence) Result {
	r := Result{ID: "3b", Name: "output due for upload ends OutputUploaded=True (False with a reason when the node was lost)"}
	for _, t := range e.Tasks {
		st := finalStatus(e, t.UID)
		if t.Deleted || st == nil || st.Reason == nil || !uploadDue(t, st) {
			continue
		}
		r.Checked++
		c := meta.FindStatusCondition(st.Conditions, v1.ConditionOutputUploaded)
		switch {
		case c != nil && c.Status == metav1.ConditionTrue:
		case *st.Reason == v1.ReasonAgentLost && c != nil && c.Status == metav1.ConditionFalse && c.Reason != "":
		case c == nil:
			r.Violations = append(r.Violations, Violation{Task: t.label(), UID: t.UID, Evidence: fmt.Sprintf("ended %s with output due and no OutputUploaded condition", *st.Reason)})
		default:
			r.Violations = append(r.Violations, Violation{Task: t.label(), UID: t.UID,
				Evidence: fmt.Sprintf("ended %s with OutputUploaded=%s/%s %q", *st.Reason, c.Status, c.Reason, c.Message)})
		}
	}
	return r
}

func checkNoLiveProcesses(e *Evidence) Result {
	r := Result{ID: "4a", Name: "no process of any task is alive at the end", Checked: len(e.Tasks)}
	names := map[string]string{}
	for _, t := range e.Tasks {
		names[t.UID] = t.Name
	}
	for _, uid := range sortedKeys(e.LiveProcesses) {
		pids := e.LiveProcesses[uid]
		state := "terminal"
		if st := finalStatus(e, uid); st == nil || st.Reason == nil {
			state = "not terminal"
		}
		name := names[uid]
		if name == "" {
			name = "<unknown task>"
		}
		r.Violations = append(r.Violations, Violation{Task: name, UID: uid, Evidence: fmt.Sprintf("%d processes alive (%s): pids %v", len(pids), state, pids)})
	}
	return r
}

func checkNoOrphanRecords(e *Evidence) Result {
	r := Result{ID: "4b", Name: "no agent holds a record of a task that no longer exists"}
	names := map[string]string{}
	for _, t := range e.Tasks {
		names[t.UID] = t.Name
	}
	for _, node := range sortedKeys(e.AgentRecordsErr) {
		r.Violations = append(r.Violations, Violation{Task: "agent " + node, Evidence: "records not read: " + e.AgentRecordsErr[node]})
	}
	for _, node := range sortedKeys(e.AgentRecords) {
		for _, uid := range e.AgentRecords[node] {
			r.Checked++
			if e.Existing[uid] {
				continue
			}
			name := names[uid]
			if name == "" {
				name = "<unknown task>"
			}
			r.Violations = append(r.Violations, Violation{Task: name, UID: uid, Evidence: fmt.Sprintf("agent %s holds it; no BashTask has this UID", node)})
		}
	}
	return r
}

// exposure is the fault time a task living from start to end was exposed
// to: each fault that overlaps [start, end] (with its allowance) counts
// with its whole length plus allowance.
func exposure(faults []FaultWindow, start, end time.Time) (time.Duration, []string) {
	var d time.Duration
	var kinds []string
	for _, f := range faults {
		fEnd := f.End.Add(f.Allowance)
		if f.Start.After(end) || fEnd.Before(start) {
			continue
		}
		d += f.End.Sub(f.Start) + f.Allowance
		kinds = append(kinds, f.Kind)
	}
	return d, kinds
}

// deadlineStart is when a task's clock starts: its creation, or when its
// referenced value appeared, or for an owner-limited task its dispatch.
func deadlineStart(t TaskInfo, obs []Observation) time.Time {
	start := t.Created
	if t.ReadyAt.After(start) {
		start = t.ReadyAt
	}
	if t.OwnerLimited {
		for _, o := range obs {
			if o.Status.NodeName != nil || meta.IsStatusConditionTrue(o.Status.Conditions, v1.ConditionScheduled) {
				if o.At.After(start) {
					start = o.At
				}
				break
			}
		}
	}
	return start
}

func checkDeadlines(e *Evidence) Result {
	r := Result{ID: "5", Name: "every task ends within timeout + grace + agent-lost window + fault exposure"}
	worst := time.Duration(1<<62 - 1)
	worstTask := ""
	for _, t := range e.Tasks {
		if t.UID == "" {
			continue
		}
		obs := e.Events[t.UID]
		r.Checked++
		start := deadlineStart(t, obs)
		end := e.End
		if i := firstTerminal(obs); i >= 0 {
			end = obs[i].At
		} else if deletedBeforeDispatch(t, obs) {
			continue
		}
		exp, kinds := exposure(e.Faults, start, end)
		limit := t.Timeout + t.Grace + e.AgentLostAfter + exp + e.Slack
		took := end.Sub(start)
		if margin := limit - took; margin < worst {
			worst, worstTask = margin, t.Name
		}
		if took > limit {
			r.Violations = append(r.Violations, Violation{Task: t.label(), UID: t.UID,
				Evidence: fmt.Sprintf("took %s, limit %s (timeout %s + grace %s + agent-lost %s + faults %s %v + slack %s)",
					took.Round(100*time.Millisecond), limit.Round(100*time.Millisecond), t.Timeout, t.Grace, e.AgentLostAfter,
					exp.Round(100*time.Millisecond), kinds, e.Slack)})
		}
	}
	if worstTask != "" {
		r.Note = fmt.Sprintf("smallest margin %s (%s)", worst.Round(100*time.Millisecond), worstTask)
	}
	return r
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// runSpan is where and when one task of a workspace ran, from its beacon
// lines.
type runSpan struct {
	uid, node   string
	first, last time.Time
}

// workspaceSpans groups the beacon's lines by workspace and task.
func workspaceSpans(lines []BeaconLine) map[string][]runSpan {
	idx := map[string]map[string]int{}
	out := map[string][]runSpan{}
	for _, l := range lines {
		if idx[l.Workspace] == nil {
			idx[l.Workspace] = map[string]int{}
		}
		key := l.UID + " " + l.Node
		i, ok := idx[l.Workspace][key]
		if !ok {
			i = len(out[l.Workspace])
			idx[l.Workspace][key] = i
			out[l.Workspace] = append(out[l.Workspace], runSpan{uid: l.UID, node: l.Node, first: l.At, last: l.At})
		}
		s := &out[l.Workspace][i]
		if l.At.Before(s.first) {
			s.first = l.At
		}
		if l.At.After(s.last) {
			s.last = l.At
		}
	}
	return out
}

// checkOneCopyRuns: no two nodes ever run tasks of one workspace at the
// same time, as the tasks' own beacon lines (received on the harness's
// clock) show.
func checkOneCopyRuns(e *Evidence) Result {
	r := Result{ID: "6a", Name: "no two nodes run tasks of one workspace at the same time (the tasks' beacon lines)"}
	spans := workspaceSpans(e.Beacon)
	for _, name := range sortedKeys(spans) {
		ss := spans[name]
		r.Checked += len(ss)
		for i := range ss {
			for j := i + 1; j < len(ss); j++ {
				a, b := ss[i], ss[j]
				if a.node == b.node || a.last.Before(b.first) || b.last.Before(a.first) {
					continue
				}
				r.Violations = append(r.Violations, Violation{Task: name, UID: a.uid,
					Evidence: fmt.Sprintf("task %s ran on %s from %s to %s while task %s ran on %s from %s to %s",
						a.uid, a.node, a.first.Format(time.StampMilli), a.last.Format(time.StampMilli),
						b.uid, b.node, b.first.Format(time.StampMilli), b.last.Format(time.StampMilli))})
			}
		}
	}
	if r.Checked > 0 {
		moves := 0
		for _, ss := range spans {
			for i := 1; i < len(ss); i++ {
				if ss[i].node != ss[i-1].node {
					moves++
				}
			}
		}
		r.Note = fmt.Sprintf("%d task runs, %d moves between nodes", r.Checked, moves)
	}
	return r
}

// checkNoOlderFiles: no task of a workspace sees files older than the
// snapshot its workspace's status named before the task started
// (status.snapshot, status.restoredFrom): the generation a task read is at
// least the generation in that snapshot's archive, read from the bucket.
func checkNoOlderFiles(e *Evidence) Result {
	r := Result{ID: "6b", Name: "no workspace task sees files older than the snapshot its workspace's status names"}
	restores := 0
	for _, l := range e.Beacon {
		if l.Kind != "start" {
			continue
		}
		obs := e.Workspaces[l.Workspace]
		// The last poll before the start: a status written later may name
		// a snapshot taken after this task's files were read.
		var last *WorkspaceObservation
		for i := range obs {
			if obs[i].At.After(l.At) {
				break
			}
			last = &obs[i]
		}
		if last == nil {
			continue
		}
		r.Checked++
		if last.RestoredFrom != "" {
			restores++
		}
		for i, u := range []string{last.Snapshot, last.RestoredFrom} {
			if u == "" || i == 1 && u == last.Snapshot {
				continue
			}
			snap, ok := e.Snapshots[u]
			if !ok || snap.Err != "" {
				r.Violations = append(r.Violations, Violation{Task: l.Workspace, UID: l.UID, Evidence: fmt.Sprintf("snapshot %s unreadable: %s", u, snap.Err)})
				continue
			}
			if l.Gen < snap.Gen {
				r.Violations = append(r.Violations, Violation{Task: l.Workspace, UID: l.UID,
					Evidence: fmt.Sprintf("task %s on %s saw generation %d; the status before it named %s, which holds generation %d", l.UID, l.Node, l.Gen, u, snap.Gen)})
			}
		}
	}
	if r.Checked > 0 {
		r.Note = fmt.Sprintf("%d starts, %d of a restored copy, %d snapshots read", r.Checked, restores, len(e.Snapshots))
	}
	return r
}
