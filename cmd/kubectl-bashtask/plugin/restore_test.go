package plugin

import (
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	bashtaskv1alpha1 "github.com/bashtask/bashtask-operator/api/v1alpha1"
)

func TestRestoreNote(t *testing.T) {
	taken := time.Date(2026, 12, 3, 10, 0, 0, 0, time.UTC)
	at := func(d time.Duration) *metav1.Time { return ptr.To(metav1.NewTime(taken.Add(d))) }
	task := func(n *bashtaskv1alpha1.WorkspaceRestoreNotice) *bashtaskv1alpha1.BashTask {
		bt := &bashtaskv1alpha1.BashTask{}
		bt.Spec.Workspace = ptr.To("w")
		bt.Status.WorkspaceRestore = n
		return bt
	}
	for _, tc := range []struct {
		name string
		bt   *bashtaskv1alpha1.BashTask
		want string
	}{
		{"no restore", task(nil), ""},
		{"after a node loss", task(&bashtaskv1alpha1.WorkspaceRestoreNotice{
			Workspace: ptr.To("w"), NodeName: ptr.To("node-2"), SnapshotTime: at(0), RestoreTime: at(20 * time.Minute),
			AgeSeconds: ptr.To[int64](1200), LostNode: ptr.To("node-1"), LostTime: at(17*time.Minute + 42*time.Second),
		}), "workspace w was restored on node-2 from a snapshot taken 17m42s before node node-1 was lost; changes after it are gone"},
		{"a loss without its time", task(&bashtaskv1alpha1.WorkspaceRestoreNotice{
			NodeName: ptr.To("node-2"), AgeSeconds: ptr.To[int64](65), LostNode: ptr.To("node-1"),
		}), "workspace w was restored on node-2 from a snapshot taken 1m5s before node node-1 was lost; changes after it are gone"},
		{"after a suspend", task(&bashtaskv1alpha1.WorkspaceRestoreNotice{
			Workspace: ptr.To("w"), NodeName: ptr.To("node-2"), SnapshotTime: at(0), AgeSeconds: ptr.To[int64](90),
		}), "workspace w was restored on node-2 from its snapshot of 2026-12-03T10:00:00Z (1m30s old)"},
	} {
		if got := restoreNote(tc.bt); got != tc.want {
			t.Errorf("%s:\n got %q\nwant %q", tc.name, got, tc.want)
		}
	}
}
