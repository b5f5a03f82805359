package agentv1

import "testing"

func TestCheckSnapshotKey(t *testing.T) {
	ref := &WorkspaceRef{Namespace: "team-b", Name: "ws", Uid: "uid-b"}
	for key, ok := range map[string]bool{
		"workspaces/team-b/ws/uid-b/3-1700000000.tar.zst":      true,
		"workspaces/team-a/ws/uid-a/3-1700000000.tar.zst":      false, // another owner's
		"workspaces/team-b/ws/uid-old/3-1700000000.tar.zst":    false, // a workspace of the name made earlier
		"workspaces/team-b/ws/uid-b/../../ws2/uid-c/1.tar.zst": false,
		"workspaces/team-b/ws/uid-b/":                          false,
		"workspaces/team-b/ws/uid-b/sub/1.tar.zst":             false,
		"team-b/ws/uid-b/stdout":                               false,
		"workspaces/team-b/ws/uid-bb/1.tar.zst":                false,
		"workspaces/team-b/ws/uid-b//1.tar.zst":                false,
		"":                                                     false,
	} {
		if err := CheckSnapshotKey(ref, key); (err == nil) != ok {
			t.Errorf("CheckSnapshotKey(%q) = %v, want ok=%v", key, err, ok)
		}
	}
	if err := CheckSnapshotKey(&WorkspaceRef{Namespace: "team-b", Name: "ws"}, "workspaces/team-b/ws/1.tar.zst"); err == nil {
		t.Error("a reference without a UID accepted a key")
	}
}
