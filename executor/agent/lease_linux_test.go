//go:build linux

package agent

import (
	"maps"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	agentv1 "github.com/bashtask/bashtask-operator/api/agent/v1"
	"github.com/bashtask/bashtask-operator/executor"
)

func tenantLevel(first, last uint32) rigOption {
	return func(c *Config) {
		c.Executor.Isolation = executor.IsolationTenant
		c.TaskUIDs = UIDRange{First: first, Last: last}
	}
}

// Each live task has its own UID from the range; a UID returns to the pool
// only when its task is over, and the lease is in the task's record.
func TestTenantTasksLeaseTheirOwnUID(t *testing.T) {
	r := newRig(t, tenantLevel(2100000, 2100001))
	_, next := r.watch()
	ctx := t.Context()
	// The tasks' first output, by task, from progress events: kept as
	// they come, since waiting for one task's event passes the other's.
	seen := map[string]string{}
	uidOf := func(task string) string {
		t.Helper()
		for seen[task] == "" {
			ev := until(t, next, agentv1.EventType_EVENT_TYPE_PROGRESS)
			if tail := ev.GetStatus().GetStdout().GetTail(); tail != "" {
				seen[ev.GetStatus().GetRef().GetUid()] = strings.TrimSpace(tail)
			}
		}
		return seen[task]
	}
	for _, task := range []string{"a", "b"} {
		if _, err := r.client.Start(ctx, &agentv1.StartRequest{Spec: taskSpec(task, "id -u; exec sleep 30")}); err != nil {
			t.Fatal(err)
		}
	}
	a, b := uidOf("a"), uidOf("b")
	if a == b || !strings.HasPrefix(a, "210000") || !strings.HasPrefix(b, "210000") {
		t.Fatalf("tasks run as %s and %s, want two different UIDs of the range", a, b)
	}
	_, err := r.client.Start(ctx, &agentv1.StartRequest{Spec: taskSpec("c", "id -u")})
	if status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("a third task with two UIDs leased: %v, want ResourceExhausted", err)
	}
	r.srv.mu.Lock()
	rec := r.srv.tasks["a"].rec.Process
	r.srv.mu.Unlock()
	if rec.TaskUID == nil || itoa(int(*rec.TaskUID)) != a || rec.LeaseReleased {
		t.Errorf("record of a: %+v, want its lease of %s", rec, a)
	}
	if _, err := r.client.Cancel(ctx, &agentv1.CancelRequest{Uid: "a"}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		_, err = r.client.Start(ctx, &agentv1.StartRequest{Spec: taskSpec("c", "id -u; exec sleep 30")})
		if err == nil || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err != nil {
		t.Fatalf("no UID for a new task after a was cancelled: %v", err)
	}
	if c := uidOf("c"); c != a {
		t.Errorf("task c runs as %s, want the UID a returned, %s", c, a)
	}
}

// The lease is in the journal: a restarted agent holds the UIDs of the
// tasks it finds and returns one only once that task's processes and
// files are gone.
func TestLeaseSurvivesRestart(t *testing.T) {
	stateDir := filepath.Join(t.TempDir(), "state")
	if err := prepareStateDir(stateDir); err != nil {
		t.Fatal(err)
	}
	st, err := openStore(stateDir, filepath.Join(stateDir, "tasks"))
	if err != nil {
		t.Fatal(err)
	}
	u0, u1 := uint32(2400000), uint32(2400001)
	ref := func(uid string) *agentv1.TaskRef {
		return &agentv1.TaskRef{Namespace: "ns", Name: "n-" + uid, Uid: uid}
	}
	// Running when the earlier agent died, nothing of it left: released
	// by the recovery.
	if err := st.write("was-running", &record{State: stateRunning, TailBytes: 100, SpillLimitBytes: 100, Process: processRecord{TaskUID: &u0}},
		&agentv1.TaskStatus{Ref: ref("was-running"), State: agentv1.TaskState_TASK_STATE_RUNNING}); err != nil {
		t.Fatal(err)
	}
	// Finished with its cleanup failed: the lease stays held.
	if err := st.write("unclean", &record{State: stateFinished, Process: processRecord{TaskUID: &u1}},
		&agentv1.TaskStatus{Ref: ref("unclean"), State: agentv1.TaskState_TASK_STATE_FINISHED, Reason: "Succeeded"}); err != nil {
		t.Fatal(err)
	}
	if err := st.close(); err != nil {
		t.Fatal(err)
	}
	r := newRig(t, tenantLevel(u0, u1), func(c *Config) { c.StateDir = stateDir })
	r.srv.mu.Lock()
	recovered := r.srv.tasks["was-running"].rec.Process
	held := maps.Clone(r.srv.leases.held)
	r.srv.mu.Unlock()
	if !recovered.LeaseReleased {
		t.Errorf("recovered task's lease not released: %+v", recovered)
	}
	if diff := cmp.Diff(map[uint32]string{u1: "unclean"}, held); diff != "" {
		t.Errorf("leases after the restart (-want +got):\n%s", diff)
	}
	if _, err := r.client.Start(t.Context(), &agentv1.StartRequest{Spec: taskSpec("new", "sleep 30")}); err != nil {
		t.Fatal(err)
	}
	if _, err := r.client.Start(t.Context(), &agentv1.StartRequest{Spec: taskSpec("newer", "true")}); status.Code(err) != codes.ResourceExhausted {
		t.Errorf("with %d held by an unclean task and %d by a new one: %v, want ResourceExhausted", u1, u0, err)
	}
}
