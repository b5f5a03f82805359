package main

import (
	"strconv"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	v1 "github.com/bashtask/bashtask-operator/api/v1alpha1"
)

// t0 is the synthetic run's start.
var t0 = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

func at(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }

// obsBuilder makes a sequence of observations of one task.
type obsBuilder struct {
	obs []Observation
	rv  int
}

func (b *obsBuilder) add(sec float64, typ string, mutate func(*v1.BashTaskStatus)) *obsBuilder {
	var st v1.BashTaskStatus
	if len(b.obs) > 0 {
		b.obs[len(b.obs)-1].Status.DeepCopyInto(&st)
	}
	if mutate != nil {
		mutate(&st)
	}
	b.rv++
	b.obs = append(b.obs, Observation{At: at(sec), Type: typ, ResourceVersion: strconv.Itoa(b.rv), Generation: 1, Status: st})
	return b
}

func pending(st *v1.BashTaskStatus) {
	st.Phase = ptr.To(v1.PhasePending)
	st.ObservedGeneration = ptr.To[int64](1)
}

func scheduled(st *v1.BashTaskStatus) {
	st.NodeName = ptr.To("node-1")
	st.Conditions = append(st.Conditions, metav1.Condition{Type: v1.ConditionScheduled, Status: metav1.ConditionTrue, Reason: "Scheduled"})
}

func running(st *v1.BashTaskStatus) {
	st.Phase = ptr.To(v1.PhaseRunning)
	st.StartTime = &metav1.Time{Time: at(1).Truncate(time.Second)}
}

func succeeded(st *v1.BashTaskStatus) {
	st.Phase = ptr.To(v1.PhaseSucceeded)
	st.Reason = ptr.To(v1.ReasonSucceeded)
	st.ExitCode = ptr.To[int32](0)
	if st.StartTime == nil {
		st.StartTime = &metav1.Time{Time: at(1).Truncate(time.Second)}
	}
	st.CompletionTime = &metav1.Time{Time: at(2).Truncate(time.Second)}
}

// cleanTask is a task that ran once and succeeded.
func cleanTask(name, uid string) (TaskInfo, []Observation, []StartRecord) {
	b := &obsBuilder{}
	b.add(0, "ADDED", nil).add(0.1, "MODIFIED", pending).add(0.2, "MODIFIED", scheduled).
		add(1, "MODIFIED", running).add(2, "MODIFIED", succeeded)
	return TaskInfo{Name: name, UID: uid, Kind: "short", Created: at(0), Timeout: 120 * time.Second, Grace: 3 * time.Second},
		b.obs, []StartRecord{{Node: "node-1", PID: 100, Source: "agent log"}, {Node: "node-1", PID: 100, Source: "command"}}
}

// baseEvidence holds n clean tasks.
func baseEvidence(n int) *Evidence {
	e := &Evidence{
		Events: map[string][]Observation{}, Starts: map[string][]StartRecord{}, Objects: map[string]ObjectInfo{},
		LiveProcesses: map[string][]int{}, AgentRecords: map[string][]string{}, Existing: map[string]bool{},
		AgentLostAfter: 10 * time.Second, Slack: 5 * time.Second, End: at(300),
	}
	// A workspace whose first task ran on node-4 and wrote generation 1,
	// snapshotted, then restored on node-5 where the next task read it.
	snap := "s3://b/workspaces/chaos/ws-a/u/1-1.tar.zst"
	e.Beacon = []BeaconLine{
		{At: at(10), Kind: "start", Workspace: "ws-a", UID: "w1", Node: "node-4", Gen: 0},
		{At: at(11), Kind: "beat", Workspace: "ws-a", UID: "w1", Node: "node-4"},
		{At: at(12), Kind: "end", Workspace: "ws-a", UID: "w1", Node: "node-4", Gen: 1},
		{At: at(30), Kind: "start", Workspace: "ws-a", UID: "w2", Node: "node-5", Gen: 1},
		{At: at(31), Kind: "end", Workspace: "ws-a", UID: "w2", Node: "node-5", Gen: 2},
	}
	e.Workspaces = map[string][]WorkspaceObservation{"ws-a": {
		{At: at(9), Phase: "Ready", Node: "node-4", Epoch: 1},
		{At: at(20), Phase: "Suspended", Epoch: 1, Snapshot: snap},
		{At: at(29), Phase: "Ready", Node: "node-5", Epoch: 2, Snapshot: snap, RestoredFrom: snap},
	}}
	e.Snapshots = map[string]SnapshotInfo{snap: {Gen: 1}}
	for i := range n {
		name, uid := "task-"+string(rune('a'+i)), "uid-"+string(rune('a'+i))
		ti, obs, starts := cleanTask(name, uid)
		e.Tasks = append(e.Tasks, ti)
		e.Events[uid] = obs
		e.Starts[uid] = starts
		e.Existing[uid] = true
	}
	return e
}

// violations returns, per invariant ID, the violations' tasks and evidence.
func violations(results []Result) map[string][]string {
	out := map[string][]string{}
	for _, r := range results {
		for _, v := range r.Violations {
			out[r.ID] = append(out[r.ID], v.Task+": "+v.Evidence)
		}
	}
	return out
}

func TestCheckCleanRunPasses(t *testing.T) {
	results := Check(baseEvidence(3))
	if got := violations(results); len(got) != 0 {
		t.Fatalf("clean evidence has violations: %v", got)
	}
	if Failed(results) {
		t.Fatal("Failed is true for clean evidence")
	}
	for _, r := range results {
		if r.Checked == 0 && r.ID != "3a" && r.ID != "3b" && r.ID != "4b" {
			t.Errorf("invariant %s checked nothing", r.ID)
		}
	}
}

func TestCheckFindsViolations(t *testing.T) {
	for name, tc := range map[string]struct {
		mutate func(e *Evidence)
		want   map[string][]string
	}{
		"double start on two nodes": {
			mutate: func(e *Evidence) {
				e.Starts["uid-a"] = append(e.Starts["uid-a"], StartRecord{Node: "node-2", PID: 200, Source: "command"})
			},
			want: map[string][]string{
				"1a": {"task-a: started 2 times: node-1 pid 100 [agent log, command]; node-2 pid 200 [command]"},
				"1b": {"task-a: reported Succeeded but started 2 times: node-1 pid 100 [agent log, command]; node-2 pid 200 [command]"},
			},
		},
		"a stale copy runs on while the workspace runs elsewhere": {
			mutate: func(e *Evidence) {
				e.Beacon = append(e.Beacon, BeaconLine{At: at(30.5), Kind: "beat", Workspace: "ws-a", UID: "w1", Node: "node-4"})
			},
			want: map[string][]string{"6a": {"ws-a: task w1 ran on node-4 from " + at(10).Format(time.StampMilli) + " to " + at(30.5).Format(time.StampMilli) +
				" while task w2 ran on node-5 from " + at(30).Format(time.StampMilli) + " to " + at(31).Format(time.StampMilli)}},
		},
		"a restored copy older than its snapshot": {
			mutate: func(e *Evidence) { e.Beacon[3].Gen = 0 },
			want: map[string][]string{"6b": {
				"ws-a: task w2 on node-5 saw generation 0; the status before it named s3://b/workspaces/chaos/ws-a/u/1-1.tar.zst, which holds generation 1",
			}},
		},
		"succeeded without a start": {
			mutate: func(e *Evidence) { delete(e.Starts, "uid-b") },
			want:   map[string][]string{"1b": {"task-b: reported Succeeded but started 0 times: "}},
		},
		"status going back from Running to Pending": {
			mutate: func(e *Evidence) {
				b := &obsBuilder{}
				b.add(0, "ADDED", nil).add(0.1, "MODIFIED", pending).add(0.2, "MODIFIED", scheduled).
					add(1, "MODIFIED", running).add(1.5, "MODIFIED", pending).add(2, "MODIFIED", succeeded)
				e.Events["uid-a"] = b.obs
			},
			want: map[string][]string{"2d": {"task-a: phase Running (rv 4) then Pending (rv 5)"}},
		},
		"terminal phase going back to Running": {
			mutate: func(e *Evidence) {
				b := &obsBuilder{obs: e.Events["uid-a"], rv: len(e.Events["uid-a"])}
				b.add(3, "MODIFIED", func(st *v1.BashTaskStatus) { st.Phase = ptr.To(v1.PhaseRunning) })
				e.Events["uid-a"] = b.obs
			},
			want: map[string][]string{"2d": {"task-a: phase Succeeded (rv 5) then Running (rv 6)"}},
		},
		"reason rewritten": {
			mutate: func(e *Evidence) {
				b := &obsBuilder{obs: e.Events["uid-c"], rv: len(e.Events["uid-c"])}
				b.add(3, "MODIFIED", func(st *v1.BashTaskStatus) {
					st.Reason = ptr.To(v1.ReasonAgentLost)
					st.Phase = ptr.To(v1.PhaseFailed)
				})
				e.Events["uid-c"] = b.obs
			},
			want: map[string][]string{
				"2a": {"task-c: reason Succeeded (rv 5) became AgentLost (rv 6)"},
				"2d": {"task-c: phase Succeeded (rv 5) then Failed (rv 6)"},
			},
		},
		"exit code and completion time rewritten": {
			mutate: func(e *Evidence) {
				b := &obsBuilder{obs: e.Events["uid-b"], rv: len(e.Events["uid-b"])}
				b.add(3, "MODIFIED", func(st *v1.BashTaskStatus) {
					st.ExitCode = ptr.To[int32](1)
					st.CompletionTime = &metav1.Time{Time: at(4).Truncate(time.Second)}
				})
				e.Events["uid-b"] = b.obs
			},
			want: map[string][]string{"2b": {"task-b: terminal at rv 5, then at rv 6: exitCode 0 -> 1, completionTime 2026-01-02T03:04:07Z -> 2026-01-02T03:04:09Z"}},
		},
		"observedGeneration decreasing": {
			mutate: func(e *Evidence) {
				b := &obsBuilder{}
				b.add(0, "ADDED", nil).add(0.1, "MODIFIED", pending).
					add(0.2, "MODIFIED", func(st *v1.BashTaskStatus) { st.ObservedGeneration = ptr.To[int64](2) }).
					add(0.3, "MODIFIED", func(st *v1.BashTaskStatus) { st.ObservedGeneration = ptr.To[int64](1) }).
					add(2, "MODIFIED", succeeded)
				e.Events["uid-a"] = b.obs
			},
			want: map[string][]string{"2c": {"task-a: observedGeneration 2 (rv 3) then 1 (rv 4)"}},
		},
		"never terminal": {
			mutate: func(e *Evidence) { e.Events["uid-a"] = e.Events["uid-a"][:4] },
			want: map[string][]string{
				"2a": {"task-a: no terminal reason: last seen MODIFIED (rv 4): phase Running, node node-1, conditions Scheduled=True/Scheduled"},
				"5":  {"task-a: took 5m0s, limit 2m18s (timeout 2m0s + grace 3s + agent-lost 10s + faults 0s [] + slack 5s)"},
			},
		},
		"uploaded object differs from the status": {
			mutate: uploadedStdout(ObjectInfo{Size: 640, SHA256: "bbbb"}),
			want:   map[string][]string{"3a": {"task-a: stdout s3://b/x/stdout: object holds 640 bytes, status spill.bytes 1000"}},
		},
		"uploaded object with another checksum": {
			mutate: uploadedStdout(ObjectInfo{Size: 1000, SHA256: "bbbb"}),
			want:   map[string][]string{"3a": {"task-a: stdout s3://b/x/stdout: object sha256 bbbb, status sha256 aaaa"}},
		},
		"upload pending at the end": {
			mutate: func(e *Evidence) {
				e.Tasks[1].ExpectUpload = true
				obs := e.Events["uid-b"]
				obs[len(obs)-1].Status.Conditions = append(obs[len(obs)-1].Status.Conditions,
					metav1.Condition{Type: v1.ConditionOutputUploaded, Status: metav1.ConditionFalse, Reason: "UploadPending", Message: "retrying"})
			},
			want: map[string][]string{"3b": {`task-b: ended Succeeded with OutputUploaded=False/UploadPending "retrying"`}},
		},
		"process alive and a record of a deleted task": {
			mutate: func(e *Evidence) {
				e.LiveProcesses["uid-a"] = []int{4242}
				e.AgentRecords["node-2"] = []string{"uid-b", "uid-gone"}
			},
			want: map[string][]string{
				"4a": {"task-a: 1 processes alive (terminal): pids [4242]"},
				"4b": {"<unknown task>: agent node-2 holds it; no BashTask has this UID"},
			},
		},
		"late end beyond faults": {
			mutate: func(e *Evidence) {
				e.Tasks[0].Timeout = 5 * time.Second
				e.Tasks[0].Grace = time.Second
				obs := e.Events["uid-a"]
				obs[len(obs)-1].At = at(60)
				e.Faults = []FaultWindow{{Kind: "etcd-stop", Start: at(10), End: at(15), Allowance: 5 * time.Second}}
			},
			want: map[string][]string{"5": {"task-a: took 1m0s, limit 31s (timeout 5s + grace 1s + agent-lost 10s + faults 10s [etcd-stop] + slack 5s)"}},
		},
		"watch gap": {
			mutate: func(e *Evidence) { e.WatchGaps = []string{"410 Gone after rv 12"} },
			want:   map[string][]string{"0": {"watch: 410 Gone after rv 12"}},
		},
	} {
		t.Run(name, func(t *testing.T) {
			e := baseEvidence(3)
			tc.mutate(e)
			results := Check(e)
			if diff := cmp.Diff(tc.want, violations(results)); diff != "" {
				t.Errorf("violations (-want +got):\n%s", diff)
			}
			if !Failed(results) {
				t.Error("Failed is false")
			}
		})
	}
}

// A fault that the task lived through lengthens its deadline; one that
// ended before it started does not.
func TestExposureCountsOverlappingFaults(t *testing.T) {
	faults := []FaultWindow{
		{Kind: "before", Start: at(0), End: at(5), Allowance: time.Second},
		{Kind: "during", Start: at(20), End: at(30), Allowance: 2 * time.Second},
		{Kind: "allowance reaches in", Start: at(5), End: at(9), Allowance: 3 * time.Second},
	}
	got, kinds := exposure(faults, at(10), at(40))
	if want := 12*time.Second + 7*time.Second; got != want {
		t.Errorf("exposure %s, want %s", got, want)
	}
	if diff := cmp.Diff([]string{"during", "allowance reaches in"}, kinds); diff != "" {
		t.Errorf("kinds (-want +got):\n%s", diff)
	}
}

// An owner-limited task's deadline starts at its dispatch, not its
// creation.
func TestDeadlineStartOwnerLimited(t *testing.T) {
	b := &obsBuilder{}
	b.add(0, "ADDED", nil).add(0.1, "MODIFIED", pending).add(30, "MODIFIED", scheduled)
	ti := TaskInfo{Created: at(0), OwnerLimited: true}
	if got := deadlineStart(ti, b.obs); !got.Equal(at(30)) {
		t.Errorf("deadline start %s, want %s", got, at(30))
	}
	ti.OwnerLimited = false
	ti.ReadyAt = at(7)
	if got := deadlineStart(ti, b.obs); !got.Equal(at(7)) {
		t.Errorf("deadline start %s, want %s", got, at(7))
	}
}

// uploadedStdout makes task-a's last status say its 1000 bytes of stdout
// (sha256 aaaa) are uploaded to s3://b/x/stdout, and the bucket hold obj
// there.
func uploadedStdout(obj ObjectInfo) func(*Evidence) {
	return func(e *Evidence) {
		obs := e.Events["uid-a"]
		obs[len(obs)-1].Status.Conditions = append(obs[len(obs)-1].Status.Conditions,
			metav1.Condition{Type: v1.ConditionOutputUploaded, Status: metav1.ConditionTrue, Reason: "Uploaded"})
		obs[len(obs)-1].Status.Stdout = &v1.StreamStatus{TotalBytes: ptr.To[int64](1000), Truncated: ptr.To(true), SHA256: ptr.To("aaaa"),
			Spill: &v1.SpillRef{URL: ptr.To("s3://b/x/stdout"), Bytes: ptr.To[int64](1000), Complete: ptr.To(true)}}
		e.Objects["s3://b/x/stdout"] = obj
	}
}
