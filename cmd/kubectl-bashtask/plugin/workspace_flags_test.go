package plugin

import (
	"strings"
	"testing"
	"time"

	"k8s.io/utils/ptr"
)

func TestWorkspaceSnapshotFlags(t *testing.T) {
	flags := func(every, after time.Duration) workspaceCreateFlags {
		return workspaceCreateFlags{snapshotEvery: every, snapshotAfterTask: after}
	}
	spec, err := workspaceSpec(flags(0, -1))
	if err != nil || spec.Snapshot != nil {
		t.Errorf("no snapshot flags: %+v %v, want no spec.snapshot", spec.Snapshot, err)
	}
	spec, err = workspaceSpec(flags(10*time.Minute, 90*time.Second))
	if err != nil || spec.Snapshot == nil || ptr.Deref(spec.Snapshot.IntervalSeconds, 0) != 600 || ptr.Deref(spec.Snapshot.AfterTaskSeconds, 0) != 90 {
		t.Errorf("--snapshot-interval 10m --snapshot-after-task 90s: %+v %v", spec.Snapshot, err)
	}
	spec, err = workspaceSpec(flags(0, 0))
	if err != nil || spec.Snapshot == nil || spec.Snapshot.AfterTaskSeconds == nil || *spec.Snapshot.AfterTaskSeconds != 0 {
		t.Errorf("--snapshot-after-task 0: %+v %v, want afterTaskSeconds 0 (off)", spec.Snapshot, err)
	}
	for _, tc := range []struct {
		f    workspaceCreateFlags
		want string
	}{
		{flags(30*time.Second, -1), "--snapshot-interval 30s"},
		{flags(25*time.Hour, -1), "--snapshot-interval 25h0m0s"},
		{flags(0, 1500*time.Millisecond), "--snapshot-after-task 1.5s"},
		{flags(0, 25*time.Hour), "--snapshot-after-task 25h0m0s"},
		{flags(0, -time.Second), "--snapshot-after-task -1s"},
	} {
		if _, err := workspaceSpec(tc.f); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: %v, want an error naming %s", tc.f, err, tc.want)
		}
	}
}
