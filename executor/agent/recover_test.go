package agent

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"gocloud.dev/blob"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	agentv1 "github.com/bashtask/bashtask-operator/api/agent/v1"
)

// TestRecoverRecords starts a server on a state directory an earlier
// incarnation left: a finished task with a pending upload, a finished and
// forgotten task, a task recorded as starting whose process never ran, a
// running task whose fresh working directory is left, and an unreadable
// record.
func TestRecoverRecords(t *testing.T) {
	stateDir := filepath.Join(t.TempDir(), "state")
	bucketDir := t.TempDir()
	if err := prepareStateDir(stateDir); err != nil {
		t.Fatal(err)
	}
	st, err := openStore(stateDir, filepath.Join(stateDir, "tasks"))
	if err != nil {
		t.Fatal(err)
	}
	ref := func(uid string) *agentv1.TaskRef {
		return &agentv1.TaskRef{Namespace: "ns", Name: "n-" + uid, Uid: uid}
	}
	write := func(uid string, rec *record, s *agentv1.TaskStatus) {
		t.Helper()
		if err := st.write(uid, rec, s); err != nil {
			t.Fatal(err)
		}
	}
	finished := func(uid string, spill *agentv1.Spill) *agentv1.TaskStatus {
		return &agentv1.TaskStatus{Ref: ref(uid), State: agentv1.TaskState_TASK_STATE_FINISHED, Reason: "Succeeded",
			IncarnationId: "earlier", Stdout: &agentv1.StreamStatus{TotalBytes: 4, Spill: spill}}
	}

	write("pending", &record{State: stateFinished}, finished("pending",
		&agentv1.Spill{Bytes: 4, Complete: true, UploadState: agentv1.UploadState_UPLOAD_STATE_PENDING}))
	if err := os.MkdirAll(st.outputDir("pending"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(st.outputDir("pending"), "stdout"), []byte("data"), 0o600); err != nil {
		t.Fatal(err)
	}
	forgotten := finished("forgotten", &agentv1.Spill{UploadState: agentv1.UploadState_UPLOAD_STATE_UPLOADED})
	forgotten.ForgetRequested = true
	write("forgotten", &record{State: stateFinished}, forgotten)
	write("starting", &record{State: stateStarting, TailBytes: 64000, SpillLimitBytes: 1 << 20},
		&agentv1.TaskStatus{Ref: ref("starting"), State: agentv1.TaskState_TASK_STATE_RUNNING, IncarnationId: "earlier"})
	// A task that ran in a fresh working directory: its process is long
	// gone (pid 0), the directory is left.
	workDir := filepath.Join(t.TempDir(), "bashtask-work-1")
	if err := os.MkdirAll(filepath.Join(workDir, "sub"), 0o700); err != nil {
		t.Fatal(err)
	}
	write("running", &record{State: stateRunning, TailBytes: 64000, SpillLimitBytes: 1 << 20, Process: processRecord{WorkDir: workDir}},
		&agentv1.TaskStatus{Ref: ref("running"), State: agentv1.TaskState_TASK_STATE_RUNNING, IncarnationId: "earlier"})
	// A frame whose checksum holds but whose record does not decode.
	if err := st.append("broken", frameRecord, []byte("{not json")); err != nil {
		t.Fatal(err)
	}
	if err := st.close(); err != nil {
		t.Fatal(err)
	}
	// An agent killed in the middle of an append left half a frame.
	jf, err := os.OpenFile(filepath.Join(stateDir, "records.journal"), os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := jf.Write([]byte{200, 0, 0, 0, 1, 2}); err != nil {
		t.Fatal(err)
	}
	if err := jf.Close(); err != nil {
		t.Fatal(err)
	}

	r := newRig(t, func(c *Config) { c.StateDir = stateDir; c.BucketURL = "file://" + bucketDir })
	// The upload resumes as soon as Run starts, maybe before a watch could
	// see it: poll.
	deadline := time.Now().Add(20 * time.Second)
	for {
		g, err := r.client.Get(t.Context(), &agentv1.GetRequest{Uid: "pending"})
		if err != nil {
			t.Fatal(err)
		}
		if g.GetStatus().GetStdout().GetSpill().GetUploadState() == agentv1.UploadState_UPLOAD_STATE_UPLOADED {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the pending upload did not resume within 20 s")
		}
		time.Sleep(20 * time.Millisecond)
	}

	l, err := r.client.List(t.Context(), &agentv1.ListRequest{})
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, s := range l.GetTasks() {
		got[s.GetRef().GetUid()] = s.GetReason() + " " + s.GetStdout().GetSpill().GetUploadState().String()
	}
	want := map[string]string{
		"pending": "Succeeded UPLOAD_STATE_UPLOADED",
		// No spill files: empty streams, nothing to upload.
		"starting": "AgentRestarted UPLOAD_STATE_NOT_NEEDED",
		"running":  "AgentRestarted UPLOAD_STATE_NOT_NEEDED",
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("recovered tasks: reason and stdout upload state (-want +got):\n%s", diff)
	}
	if r.srv.store.exists("forgotten") {
		t.Error("files of a forgotten task after recovery, want them gone")
	}
	if r.srv.store.damaged == nil {
		t.Error("the half frame at the journal's end was not reported")
	}
	if !r.srv.store.exists("broken") {
		t.Error("unreadable record dropped by recovery, want it kept")
	}
	_, err = r.client.Start(t.Context(), &agentv1.StartRequest{Spec: taskSpec("broken", "true")})
	if status.Code(err) != codes.FailedPrecondition {
		t.Errorf("Start over an unreadable record: %v, want FailedPrecondition", err)
	}

	b, err := blob.OpenBucket(t.Context(), "file://"+bucketDir)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	data, err := b.ReadAll(t.Context(), "ns/n-pending/pending/stdout")
	if err != nil || string(data) != "data" {
		t.Errorf("resumed upload: %q, %v; want %q", data, err, "data")
	}
}
