package e2e

import (
	"strings"
	"testing"

	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/bashtask/bashtask-operator/api/v1alpha1"
)

type mcpWorkspace struct {
	Name, Phase, Node string
}

// TestMCPFork drives workspace_fork over stdio from the Go SDK's client:
// two copies of a workspace, each Ready with the source's files and the
// server's owner whatever owner the model gave, each changed its own way
// while the source keeps its files; a missing source, another owner's
// source and a count out of range are tool errors naming what to fix.
func TestMCPFork(t *testing.T) {
	needWorkspaces(t)
	ns := newNamespace(t)
	s := mcpSession(t, ns, "o1", nil)
	var ws mcpWorkspace
	mustCall(t, s, "workspace_create", map[string]any{"name": "src", "network": "None"}, &ws)
	mustCall(t, s, "write_file", map[string]any{"workspace": "src", "path": "n.txt", "content": "base\n"}, nil)

	var f struct {
		Source     string
		Workspaces []mcpWorkspace
	}
	mustCall(t, s, "workspace_fork", map[string]any{"source": "src", "count": 2, "name_prefix": "try-", "owner": "o2"}, &f)
	if f.Source != "src" || len(f.Workspaces) != 2 {
		t.Fatalf("workspace_fork: %+v, want 2 copies of src", f)
	}
	for i, c := range f.Workspaces {
		if !strings.HasPrefix(c.Name, "try-") || c.Phase != string(v1.WorkspaceReady) || c.Node == "" {
			t.Errorf("copy %d: %+v, want try-*, Ready on a node", i, c)
		}
		var got v1.BashWorkspace
		if err := k8s.Get(t.Context(), client.ObjectKey{Namespace: ns, Name: c.Name}, &got); err != nil {
			t.Fatal(err)
		}
		if ptr.Deref(got.Spec.Owner, "") != "o1" || got.Spec.Source == nil || got.Spec.Source.Workspace != "src" {
			t.Errorf("copy %s: owner %q, source %+v; want the server's o1 whatever the model said, and src", c.Name, ptr.Deref(got.Spec.Owner, ""), got.Spec.Source)
		}
		// A different change in each copy.
		var r mcpRun
		mustCall(t, s, "run", map[string]any{"workspace": c.Name, "command": "echo change-" + c.Name + " >> n.txt; cat n.txt"}, &r)
		if r.Stdout != "base\nchange-"+c.Name+"\n" {
			t.Errorf("copy %s: n.txt %q, want the source's line and its own change", c.Name, r.Stdout)
		}
	}
	var src struct{ Content string }
	mustCall(t, s, "read_file", map[string]any{"workspace": "src", "path": "n.txt"}, &src)
	if src.Content != "base\n" {
		t.Errorf("the source's n.txt after the copies' changes: %q", src.Content)
	}

	mustRefuse(t, s, "workspace_fork", map[string]any{"source": "nope"}, `"nope" not found`)
	mustRefuse(t, s, "workspace_fork", map[string]any{"source": "src", "count": 17}, "count 17 is out of range: 1 to 16 copies")
	createWorkspace(t, ns, "theirs", "--owner", "o2", "--network", "None")
	mustRefuse(t, s, "workspace_fork", map[string]any{"source": "theirs", "owner": "o2"}, `workspace theirs belongs to owner "o2"`)
	var list v1.BashWorkspaceList
	if err := k8s.List(t.Context(), &list, client.InNamespace(ns)); err != nil || len(list.Items) != 4 {
		t.Errorf("workspaces after the refused forks: %d (%v), want src, its 2 copies and theirs", len(list.Items), err)
	}

	for _, name := range []string{f.Workspaces[0].Name, f.Workspaces[1].Name, "src"} {
		mustCall(t, s, "workspace_delete", map[string]any{"name": name}, &ws)
	}
}
