//go:build linux

package agent

import (
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	agentv1 "github.com/bashtask/bashtask-operator/api/agent/v1"
	"github.com/bashtask/bashtask-operator/executor"
)

// The agent's disk quota (--task-disk-size, --task-disk-cap): readiness
// names the capability and the cap, the images live in the state
// directory, a task past its quota fails with ENOSPC, and one that asks
// for more than the cap is refused naming the field and the cap.
func TestAgentDiskQuota(t *testing.T) {
	if _, err := os.Stat("/dev/loop-control"); err != nil {
		t.Skipf("no loop devices: %v", err)
	}
	r := newRig(t, tenantLevel(2100610, 2100619), func(c *Config) {
		c.Executor.DiskQuotaBytes, c.Executor.DiskQuotaCapBytes = 64<<20, 128<<20
	})
	info, _ := r.watch()
	if rd := info.GetReadiness(); !slices.Contains(rd.GetCapabilities(), "disk-quota") || rd.GetDiskCapBytes() != 128<<20 {
		t.Fatalf("readiness capabilities %v, disk cap %d: want disk-quota and %d", rd.GetCapabilities(), rd.GetDiskCapBytes(), 128<<20)
	}
	if images, _ := filepath.Glob(filepath.Join(r.dir, "state", "disk-images", "*.img")); len(images) == 0 {
		t.Errorf("no images in the state directory's disk-images")
	}
	finish := func(uid string) *agentv1.TaskStatus {
		t.Helper()
		deadline := time.Now().Add(time.Minute)
		for {
			resp, err := r.client.Get(t.Context(), &agentv1.GetRequest{Uid: uid})
			if err != nil {
				t.Fatal(err)
			}
			if st := resp.GetStatus(); st.GetState() == agentv1.TaskState_TASK_STATE_FINISHED {
				return st
			}
			if time.Now().After(deadline) {
				t.Fatalf("task %s did not finish", uid)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	if _, err := r.client.Start(t.Context(), &agentv1.StartRequest{Spec: taskSpec("quota-full", "dd if=/dev/zero of=f bs=1M count=100; echo rc=$?")}); err != nil {
		t.Fatal(err)
	}
	st := finish("quota-full")
	if !strings.Contains(st.GetStderr().GetTail(), "No space left on device") || strings.Contains(st.GetStdout().GetTail(), "rc=0") {
		t.Errorf("100 MiB into 64 MiB: stdout %q, stderr %q; want dd failing with ENOSPC", st.GetStdout().GetTail(), st.GetStderr().GetTail())
	}
	over := taskSpec("quota-over", "true")
	over.Resources = &agentv1.Resources{EphemeralStorageBytes: 256 << 20}
	if _, err := r.client.Start(t.Context(), &agentv1.StartRequest{Spec: over}); err != nil {
		t.Fatal(err)
	}
	st = finish("quota-over")
	if st.GetReason() != string(executor.ReasonStartFailed) || !strings.Contains(st.GetMessage(), "spec.resources.ephemeralStorage") || !strings.Contains(st.GetMessage(), strconv.Itoa(128<<20)) {
		t.Errorf("over the cap: %s %q, want StartFailed naming the field and the cap", st.GetReason(), st.GetMessage())
	}
}
