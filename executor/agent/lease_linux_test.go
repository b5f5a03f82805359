//go:build linux

package agent

import (
	"strings"
	"testing"
	"time"

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
	uidOf := func(task string) string {
		t.Helper()
		for {
			ev := until(t, next, agentv1.EventType_EVENT_TYPE_PROGRESS)
			if ev.GetStatus().GetRef().GetUid() == task && ev.GetStatus().GetStdout().GetTail() != "" {
				return strings.TrimSpace(ev.GetStatus().GetStdout().GetTail())
			}
		}
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
