//go:build linux

package executor

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"
)

// A workspace task stops on its own once the node's lease on its
// workspaces lapses, whether the lease ran out (no controller watches
// the agent) or its renewals stopped (the agent is stopped: Close stands
// for a renewal loop that no longer runs); a task of the lease held runs
// on, and no workspace task starts on a lapsed lease.
func TestLeaseFencesWorkspaceTasks(t *testing.T) {
	t.Parallel()
	const window = 800 * time.Millisecond
	for _, tc := range []struct {
		name  string
		lapse func(*Lease)
	}{
		{"lease ran out", func(*Lease) {}},
		{"renewals stopped", func(l *Lease) { l.Close() }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			lease := NewLease()
			t.Cleanup(lease.Close)
			ex := tenantExecutor(t, func(c *Config) { c.Lease = lease })
			w := testWorkspace(t, ex, NetworkNone, false)

			// Held: the lease runs well ahead, so the task outlives
			// several windows.
			lease.Extend(window, time.Now().Add(time.Hour))
			task, err := ex.Start(wsSpec(t, w, `echo up; sleep 300`, "", false))
			if err != nil {
				t.Fatal(err)
			}
			waitForOutput(t, task, "up")
			select {
			case <-task.Done():
				res, _ := task.Result()
				t.Fatalf("task of a held lease ended: %s %q", res.Reason, res.Message)
			case <-time.After(4 * window):
			}
			if tc.name == "lease ran out" {
				// The last watch ended: the lease runs one more window.
				lease.mu.Lock()
				lease.until = time.Now().Add(window / 2)
				lease.mu.Unlock()
			}
			lapsed := time.Now()
			tc.lapse(lease)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			res, err := task.Wait(ctx)
			if err != nil {
				t.Fatalf("the task did not stop after its lease lapsed: %v", err)
			}
			took := time.Since(lapsed)
			if res.Reason != ReasonSignaled || res.Signal != "SIGKILL" {
				t.Errorf("fenced task ended %s %s %q, want Signaled by SIGKILL", res.Reason, res.Signal, res.Message)
			}
			if !strings.Contains(res.Message, "fenced") {
				t.Errorf("message %q does not say the task was fenced", res.Message)
			}
			if took > window+window/2+time.Second {
				t.Errorf("the task ended %v after its lease lapsed, want within about a window (%v)", took, window)
			}
			if lease.Held(window) {
				return
			}
			// Lapsed: a new task of the workspace does not start.
			_, err = ex.Start(wsSpec(t, w, `echo must-not-run`, "", false))
			var se *StartError
			if !errors.As(err, &se) || !errors.Is(se.Kind, ErrLeaseExpired) {
				t.Errorf("Start on a lapsed lease: %v, want ErrLeaseExpired", err)
			}
		})
	}
}
