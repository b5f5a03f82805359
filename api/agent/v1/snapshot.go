package agentv1

import (
	"fmt"
	"path"
	"strings"
)

// SnapshotKeyPrefix is the bucket prefix under which every snapshot of
// the workspace ref lives: "workspaces/<namespace>/<name>/<uid>/". A
// workspace's UID is in it, so a workspace made again under the same name
// has a prefix of its own.
func SnapshotKeyPrefix(ref *WorkspaceRef) string {
	return path.Join("workspaces", ref.GetNamespace(), ref.GetName(), ref.GetUid()) + "/"
}

// CheckSnapshotKey returns an error, naming both, unless key is a
// snapshot of the workspace ref: a clean key under
// SnapshotKeyPrefix(ref), one more path element below it. Both the
// controller and the agent check a snapshot this way before a restore, so
// that a status pointing one workspace at another's snapshot restores
// nothing (docs/security.md).
func CheckSnapshotKey(ref *WorkspaceRef, key string) error {
	prefix := SnapshotKeyPrefix(ref)
	rest, ok := strings.CutPrefix(key, prefix)
	if !ok || rest == "" || strings.Contains(rest, "/") || path.Clean(key) != key || ref.GetUid() == "" {
		return fmt.Errorf("snapshot %q is not one of workspace %s/%s (uid %s): its snapshots are under %q",
			key, ref.GetNamespace(), ref.GetName(), ref.GetUid(), prefix)
	}
	return nil
}
