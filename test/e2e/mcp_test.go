package e2e

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/bashtask/bashtask-operator/api/v1alpha1"
)

// mcpSession starts `kubectl-bashtask mcp` over stdio with the
// administrator's kubeconfig, as a client such as Claude Code does, and
// connects the Go SDK's client to it.
func mcpSession(t *testing.T, ns, owner string, copts *mcp.ClientOptions) *mcp.ClientSession {
	t.Helper()
	cmd := exec.Command(filepath.Join(binDir, "kubectl-bashtask"), "--kubeconfig", filepath.Join(clusterDir, "kubeconfig"), "-n", ns, "mcp", "--owner", owner)
	c := mcp.NewClient(&mcp.Implementation{Name: "e2e", Version: "v0"}, copts)
	s, err := c.Connect(t.Context(), &mcp.CommandTransport{Command: cmd}, nil)
	if err != nil {
		t.Fatalf("connecting to kubectl-bashtask mcp: %v", err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// callTool calls a tool and decodes its structured result into out; a
// tool error is returned as its text.
func callTool(ctx context.Context, s *mcp.ClientSession, name string, args map[string]any, out any) (toolErr string, err error) {
	res, err := s.CallTool(ctx, &mcp.CallToolParams{Name: name, Arguments: args})
	if err != nil {
		return "", err
	}
	if res.IsError {
		var texts []string
		for _, c := range res.Content {
			if tc, ok := c.(*mcp.TextContent); ok {
				texts = append(texts, tc.Text)
			}
		}
		return strings.Join(texts, "\n"), nil
	}
	if out != nil {
		raw, err := json.Marshal(res.StructuredContent)
		if err != nil {
			return "", err
		}
		return "", json.Unmarshal(raw, out)
	}
	return "", nil
}

// mustCall calls a tool that must succeed.
func mustCall(t *testing.T, s *mcp.ClientSession, name string, args map[string]any, out any) {
	t.Helper()
	toolErr, err := callTool(t.Context(), s, name, args, out)
	if err != nil || toolErr != "" {
		t.Fatalf("%s %v: error %v, tool error %q", name, args, err, toolErr)
	}
}

// mustRefuse calls a tool that must end in a tool error containing want.
func mustRefuse(t *testing.T, s *mcp.ClientSession, name string, args map[string]any, want string) {
	t.Helper()
	toolErr, err := callTool(t.Context(), s, name, args, nil)
	if err != nil || !strings.Contains(toolErr, want) {
		t.Errorf("%s %v: error %v, tool error %q; want a tool error containing %q", name, args, err, toolErr, want)
	}
}

type mcpRun struct {
	Task             string `json:"task"`
	ExitCode         int    `json:"exit_code"`
	Reason           string `json:"reason"`
	Stdout, Stderr   string
	StdoutTailOffset int64 `json:"stdout_tail_offset"`
	StdoutBytes      int64 `json:"stdout_bytes"`
	StderrBytes      int64 `json:"stderr_bytes"`
}

type mcpRead struct {
	Data       string `json:"data"`
	NextOffset int64  `json:"next_offset"`
	Finished   bool   `json:"finished"`
	TotalBytes *int64 `json:"total_bytes"`
	Reason     string `json:"reason"`
}

// mcpReadAll reads a task's stdout through read_output until it has ended
// and every byte was read.
func mcpReadAll(t *testing.T, s *mcp.ClientSession, task string) mcpRead {
	t.Helper()
	var all mcpRead
	for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); {
		var r mcpRead
		mustCall(t, s, "read_output", map[string]any{"task": task, "offset": all.NextOffset, "wait_seconds": 5}, &r)
		all.Data += r.Data
		all.NextOffset, all.Finished, all.TotalBytes, all.Reason = r.NextOffset, r.Finished, r.TotalBytes, r.Reason
		if r.Finished && r.TotalBytes != nil && r.NextOffset == *r.TotalBytes {
			return all
		}
	}
	t.Fatalf("read_output of %s: not finished after a minute: %+v", task, all)
	return all
}

// TestMCPTools drives every tool of `kubectl bashtask mcp` over stdio from
// the Go SDK's client: workspaces, files, run with progress, start with
// output by offset and stdin, cancel, resources; the owner a model gives
// is ignored and another owner's workspace refused.
func TestMCPTools(t *testing.T) {
	needWorkspaces(t)
	ns := newNamespace(t)
	var progress atomic.Int32
	s := mcpSession(t, ns, "o1", &mcp.ClientOptions{ProgressNotificationHandler: func(context.Context, *mcp.ProgressNotificationClientRequest) {
		progress.Add(1)
	}})

	// A model-supplied owner is ignored: the workspace and its tasks are
	// the server's owner's.
	var ws struct{ Phase string }
	mustCall(t, s, "workspace_create", map[string]any{"name": "w1", "network": "None", "owner": "o2"}, &ws)
	if ws.Phase != string(v1.WorkspaceReady) {
		t.Fatalf("workspace_create: phase %q, want Ready", ws.Phase)
	}
	var got v1.BashWorkspace
	if err := k8s.Get(t.Context(), client.ObjectKey{Namespace: ns, Name: "w1"}, &got); err != nil || ptr.Deref(got.Spec.Owner, "") != "o1" {
		t.Fatalf("workspace w1: spec.owner %q (%v), want the server's o1 whatever the model said", ptr.Deref(got.Spec.Owner, ""), err)
	}

	mcpFiles(t, s)

	var r mcpRun
	mustCall(t, s, "run", map[string]any{"workspace": "w1", "command": "cat hello.txt; echo err >&2; exit 3", "owner": "o2"}, &r)
	if r.ExitCode != 3 || r.Stdout != "hi\n" || r.Stderr != "err\n" || r.StdoutBytes != 3 || r.StderrBytes != 4 || r.StdoutTailOffset != 0 {
		t.Errorf("run: %+v; want exit 3, stdout hi, stderr err, offsets", r)
	}
	var task v1.BashTask
	if err := k8s.Get(t.Context(), client.ObjectKey{Namespace: ns, Name: r.Task}, &task); err != nil || ptr.Deref(task.Spec.Owner, "") != "o1" {
		t.Errorf("task %s: spec.owner %q (%v), want o1", r.Task, ptr.Deref(task.Spec.Owner, ""), err)
	}
	params := &mcp.CallToolParams{Name: "run", Arguments: map[string]any{"workspace": "w1", "command": "seq 3000 | tail -c 100; sleep 2.5", "tail_bytes": 10}}
	params.SetProgressToken("p1")
	res, err := s.CallTool(t.Context(), params)
	if err != nil || res.IsError {
		t.Fatalf("run with progress: %v %+v", err, res)
	}
	if progress.Load() == 0 {
		t.Errorf("run of 2.5 s with a progress token: no progress notification")
	}
	raw, _ := json.Marshal(res.StructuredContent)
	_ = json.Unmarshal(raw, &r)
	if r.Stdout != "2999\n3000\n" || r.StdoutTailOffset != 90 || r.StdoutBytes != 100 {
		t.Errorf("run with tail_bytes 10: %+v; want the last 10 of 100 bytes at offset 90", r)
	}

	mcpBackground(t, s)
	mcpOwnerRule(t, ns, s)
	mcpCancellation(t, ns, s)

	mustCall(t, s, "workspace_suspend", map[string]any{"name": "w1"}, &ws)
	mustCall(t, s, "workspace_resume", map[string]any{"name": "w1"}, &ws)
	mustCall(t, s, "run", map[string]any{"workspace": "w1", "command": "cat hello.txt"}, &r)
	if r.Stdout != "hi\n" || ws.Phase != string(v1.WorkspaceReady) {
		t.Errorf("after suspend and resume: phase %q, run %+v", ws.Phase, r)
	}
	mustCall(t, s, "workspace_delete", map[string]any{"name": "w1"}, &ws)
	if ws.Phase != "Deleted" {
		t.Errorf("workspace_delete: phase %q", ws.Phase)
	}
}

// mcpFiles: write_file, read_file (text, binary refused as text and
// given as base64), list_dir and the file as a resource.
func mcpFiles(t *testing.T, s *mcp.ClientSession) {
	t.Helper()
	mustCall(t, s, "write_file", map[string]any{"workspace": "w1", "path": "hello.txt", "content": "hi\n"}, nil)
	mustCall(t, s, "write_file", map[string]any{"workspace": "w1", "path": "bin.dat", "content": base64.StdEncoding.EncodeToString([]byte{0, 0xff, 1}), "encoding": "base64"}, nil)
	var f struct{ Content, Encoding string }
	mustCall(t, s, "read_file", map[string]any{"workspace": "w1", "path": "hello.txt"}, &f)
	if f.Content != "hi\n" || f.Encoding != "text" {
		t.Errorf("read_file hello.txt: %+v", f)
	}
	mustRefuse(t, s, "read_file", map[string]any{"workspace": "w1", "path": "bin.dat"}, "binary file")
	mustCall(t, s, "read_file", map[string]any{"workspace": "w1", "path": "bin.dat", "encoding": "base64"}, &f)
	if f.Content != "AP8B" {
		t.Errorf("read_file bin.dat as base64: %+v", f)
	}
	mustRefuse(t, s, "read_file", map[string]any{"workspace": "w1", "path": "hello.txt", "max_bytes": 2}, "over the limit")
	mustRefuse(t, s, "write_file", map[string]any{"workspace": "w1", "path": "nodir/x", "content": "x"}, "No such file or directory")
	var l struct {
		Entries []struct{ Name, Type string }
	}
	mustCall(t, s, "list_dir", map[string]any{"workspace": "w1"}, &l)
	var names []string
	for _, e := range l.Entries {
		names = append(names, e.Name+":"+e.Type)
	}
	if !slices.Contains(names, "hello.txt:file") || !slices.Contains(names, "bin.dat:file") {
		t.Errorf("list_dir: %v; want hello.txt and bin.dat", names)
	}
	rr, err := s.ReadResource(t.Context(), &mcp.ReadResourceParams{URI: "bashtask://w1/hello.txt"})
	if err != nil || len(rr.Contents) != 1 || rr.Contents[0].Text != "hi\n" {
		t.Errorf("resource bashtask://w1/hello.txt: %v %+v", err, rr)
	}
}

// mcpBackground: start with stdin, write_stdin, read_output by offset;
// start and cancel.
func mcpBackground(t *testing.T, s *mcp.ClientSession) {
	t.Helper()
	var st struct{ Task string }
	mustCall(t, s, "start", map[string]any{"workspace": "w1", "command": "echo first; cat", "stdin": true}, &st)
	var in struct{ Offset int64 }
	mustCall(t, s, "write_stdin", map[string]any{"task": st.Task, "data": "abc\n", "close": true}, &in)
	if in.Offset != 4 {
		t.Errorf("write_stdin: offset %d, want 4", in.Offset)
	}
	if got := mcpReadAll(t, s, st.Task); got.Data != "first\nabc\n" {
		t.Errorf("read_output of %s: %q, want first and the input", st.Task, got.Data)
	}
	var part mcpRead
	mustCall(t, s, "read_output", map[string]any{"task": st.Task, "offset": 6, "max_bytes": 2}, &part)
	if part.Data != "ab" || part.NextOffset != 8 {
		t.Errorf("read_output from offset 6, 2 bytes: %+v", part)
	}
	mustCall(t, s, "start", map[string]any{"workspace": "w1", "command": "echo up; sleep 100"}, &st)
	mustCall(t, s, "cancel", map[string]any{"task": st.Task}, nil)
	// Cancelled before or after it started: its output, if any, is read.
	if got := mcpReadAll(t, s, st.Task); got.Reason != string(v1.ReasonCancelled) || (got.Data != "up\n" && got.Data != "") {
		t.Errorf("a cancelled task: %+v", got)
	}
}

// mcpOwnerRule: another owner's workspace is refused by every tool.
func mcpOwnerRule(t *testing.T, ns string, s *mcp.ClientSession) {
	t.Helper()
	createWorkspace(t, ns, "other", "--owner", "o2", "--network", "None")
	mustRefuse(t, s, "run", map[string]any{"workspace": "other", "command": "true", "owner": "o2"}, `belongs to owner "o2"`)
	mustRefuse(t, s, "start", map[string]any{"workspace": "other", "command": "true", "owner": "o2"}, `belongs to owner "o2"`)
	mustRefuse(t, s, "workspace_delete", map[string]any{"name": "other", "owner": "o2"}, `belongs to owner "o2"`)
	mustRefuse(t, s, "read_file", map[string]any{"workspace": "other", "path": "x", "owner": "o2"}, `belongs to owner "o2"`)
	name, errOut, code := plugin(t.Context(), "", "-n", ns, "run", "-w", "other", "--detach", "--", "sleep 30")
	if name = strings.TrimSpace(name); code != 0 || name == "" {
		t.Fatalf("a task of owner o2: exit %d, %q %q", code, name, errOut)
	}
	mustRefuse(t, s, "read_output", map[string]any{"task": name}, `belongs to owner "o2"`)
	mustRefuse(t, s, "cancel", map[string]any{"task": name}, `belongs to owner "o2"`)
	mustRefuse(t, s, "write_stdin", map[string]any{"task": name, "data": "x"}, `belongs to owner "o2"`)
}

// mcpCancellation: a client that cancels its run request cancels the
// task.
func mcpCancellation(t *testing.T, ns string, s *mcp.ClientSession) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Second)
	defer cancel()
	if _, err := callTool(ctx, s, "run", map[string]any{"workspace": "w1", "command": "sleep 300 # cancelled"}, nil); err == nil {
		t.Fatal("run of sleep 300 ended before its request was cancelled")
	}
	deadline := time.Now().Add(time.Minute)
	for {
		var tasks v1.BashTaskList
		if err := k8s.List(t.Context(), &tasks, client.InNamespace(ns)); err != nil {
			t.Fatal(err)
		}
		i := slices.IndexFunc(tasks.Items, func(x v1.BashTask) bool { return strings.HasSuffix(x.Spec.Command, "# cancelled") })
		if i >= 0 && ptr.Deref(tasks.Items[i].Status.Reason, "") == v1.ReasonCancelled {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the task of a cancelled run request did not end Cancelled within a minute")
		}
		time.Sleep(200 * time.Millisecond)
	}
}
