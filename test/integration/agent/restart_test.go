package agent_test

import (
	"io"
	"path/filepath"
	"testing"
	"time"

	"gocloud.dev/blob"
	_ "gocloud.dev/blob/fileblob"
	"google.golang.org/protobuf/types/known/durationpb"

	agentv1 "github.com/bashtask/bashtask-operator/api/agent/v1"
)

// TestRestartRecovery is case C30 at the agent level: an agent killed with
// SIGKILL while `echo before; sleep 60` runs; the next agent process on the
// same state directory stops the sleep, reports the task AgentRestarted
// with `before\n` kept, and uploads it. It runs with the task in its own
// cgroup (stopped through cgroup.kill) and with process groups only
// (stopped through the recorded process group).
func TestRestartRecovery(t *testing.T) {
	for name, cgroups := range map[string]string{"cgroup": "auto", "process group": "off"} {
		t.Run(name, func(t *testing.T) { testRestartRecovery(t, cgroups) })
	}
}

func testRestartRecovery(t *testing.T, cgroups string) {
	p := newPKI(t)
	stateDir := filepath.Join(t.TempDir(), "state")
	bucketDir := t.TempDir()
	bucketURL := "file://" + bucketDir
	const uid = "restart-1"

	first := startAgent(t, p, stateDir, bucketURL, nil, "--cgroups", cgroups)
	c1 := first.client(t, p)
	w1 := watch(t, c1)
	_, err := c1.Start(t.Context(), &agentv1.StartRequest{Spec: &agentv1.TaskSpec{
		Ref:     &agentv1.TaskRef{Namespace: "ns", Name: "restart", Uid: uid},
		Command: "echo before; sleep 60",
		Timeout: durationpb.New(120 * time.Second),
	}})
	if err != nil {
		t.Fatal(err)
	}
	// Once a progress event shows the output, the agent has read it into
	// the spill file.
	w1.until(uid, 20*time.Second, "progress with output", func(ev *agentv1.TaskEvent) bool {
		return ev.GetType() == agentv1.EventType_EVENT_TYPE_PROGRESS && ev.GetStatus().GetStdout().GetTail() == "before\n"
	})
	leftovers := tasksWithMarker(uid)
	if len(leftovers) == 0 {
		t.Fatal("no live process of the task found before the kill")
	}
	first.kill()
	for _, pid := range leftovers {
		if !alive(pid) {
			t.Fatalf("process %d of the task died with the agent; the test proves nothing", pid)
		}
	}

	second := startAgent(t, p, stateDir, bucketURL, nil, "--cgroups", cgroups)
	c2 := second.client(t, p)
	w2 := watch(t, c2)
	if w2.info.GetIncarnationId() == "" || w2.info.GetIncarnationId() == w1.info.GetIncarnationId() {
		t.Errorf("incarnation ids %q then %q, want a new one", w1.info.GetIncarnationId(), w2.info.GetIncarnationId())
	}
	cur := w2.until(uid, 20*time.Second, "current state", isType(agentv1.EventType_EVENT_TYPE_CURRENT)).GetStatus()
	if cur.GetState() != agentv1.TaskState_TASK_STATE_FINISHED || cur.GetReason() != "AgentRestarted" {
		t.Fatalf("task after restart: state %v reason %q, want FINISHED AgentRestarted", cur.GetState(), cur.GetReason())
	}
	if got := cur.GetStdout().GetTail(); got != "before\n" {
		t.Errorf("stdout after restart %q, want %q", got, "before\n")
	}
	if cur.GetLeftoverProcesses() < 1 {
		t.Errorf("leftover processes %d, want at least 1 (the sleep)", cur.GetLeftoverProcesses())
	}
	for _, pid := range leftovers {
		if alive(pid) {
			t.Errorf("process %d of the earlier incarnation still alive", pid)
		}
	}

	// The upload may have finished before the watch began.
	if cur.GetStdout().GetSpill().GetUploadState() != agentv1.UploadState_UPLOAD_STATE_UPLOADED {
		w2.until(uid, 20*time.Second, "upload", isType(agentv1.EventType_EVENT_TYPE_UPLOADED))
	}
	b, err := blob.OpenBucket(t.Context(), bucketURL)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	r, err := b.NewReader(t.Context(), "ns/restart/"+uid+"/stdout", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	data, err := io.ReadAll(r)
	if err != nil {
		t.Fatal(err)
	}
	if string(data) != "before\n" {
		t.Errorf("uploaded stdout %q, want %q", data, "before\n")
	}
	f, err := c2.Forget(t.Context(), &agentv1.ForgetRequest{Uid: uid})
	if err != nil || !f.GetForgotten() {
		t.Errorf("Forget after upload: %v, %v; want forgotten", f, err)
	}
}

// TestShutdownStopsTasks: on SIGTERM the agent stops its running task, sends
// its terminal event (AgentRestarted) before ending the stream, and the
// next agent process reports the same recorded status.
func TestShutdownStopsTasks(t *testing.T) {
	p := newPKI(t)
	stateDir := filepath.Join(t.TempDir(), "state")
	bucketURL := "file://" + t.TempDir()
	const uid = "shutdown-1"

	first := startAgent(t, p, stateDir, bucketURL, nil)
	c1 := first.client(t, p)
	w1 := watch(t, c1)
	_, err := c1.Start(t.Context(), &agentv1.StartRequest{Spec: &agentv1.TaskSpec{
		Ref:       &agentv1.TaskRef{Namespace: "ns", Name: "shutdown", Uid: uid},
		Command:   "echo up; sleep 60",
		KillGrace: durationpb.New(time.Second),
	}})
	if err != nil {
		t.Fatal(err)
	}
	w1.until(uid, 20*time.Second, "output", func(ev *agentv1.TaskEvent) bool {
		return ev.GetStatus().GetStdout().GetTail() == "up\n"
	})
	leftovers := tasksWithMarker(uid)
	first.stop(t)
	fin := w1.until(uid, 5*time.Second, "terminal event", isType(agentv1.EventType_EVENT_TYPE_FINISHED)).GetStatus()
	if fin.GetReason() != "AgentRestarted" || fin.GetStdout().GetTail() != "up\n" {
		t.Errorf("terminal status on shutdown: reason %q stdout %q, want AgentRestarted with %q", fin.GetReason(), fin.GetStdout().GetTail(), "up\n")
	}
	for _, pid := range leftovers {
		if alive(pid) {
			t.Errorf("process %d of the task alive after the agent shut down", pid)
		}
	}

	second := startAgent(t, p, stateDir, bucketURL, nil)
	w2 := watch(t, second.client(t, p))
	cur := w2.until(uid, 20*time.Second, "current state", isType(agentv1.EventType_EVENT_TYPE_CURRENT)).GetStatus()
	if cur.GetReason() != "AgentRestarted" || cur.GetIncarnationId() != w1.info.GetIncarnationId() {
		t.Errorf("status after restart: reason %q incarnation %q, want AgentRestarted from %q", cur.GetReason(), cur.GetIncarnationId(), w1.info.GetIncarnationId())
	}
}
