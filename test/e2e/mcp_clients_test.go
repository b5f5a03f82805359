package e2e

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	authnv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/bashtask/bashtask-operator/api/v1alpha1"
)

// mcpClientsDir holds the npm clients hack/mcp-clients.sh installs.
func mcpClientsDir(t *testing.T) string {
	t.Helper()
	dir := filepath.Join(root, "test", "e2e", "mcpclients")
	if _, err := os.Stat(filepath.Join(dir, "node_modules", "@modelcontextprotocol", "sdk")); err != nil {
		t.Fatalf("the npm MCP clients are missing; run the suite through `make test-e2e`, whose mcp-clients target installs them: %v", err)
	}
	return dir
}

// TestMCPTypeScriptClient drives each tool of `kubectl bashtask mcp` from
// the official TypeScript SDK (test/e2e/mcpclients/client.mjs), including
// a request the client aborts, whose task must end Cancelled, forks changed
// each its own way, and another owner's workspace refused; then the session
// of docs/mcp.md (transcript.mjs), which it prints.
func TestMCPTypeScriptClient(t *testing.T) {
	needWorkspaces(t)
	ns := newNamespace(t)
	dir := mcpClientsDir(t)
	createWorkspace(t, ns, "theirs", "--owner", "o2", "--network", "None")
	cmd := exec.CommandContext(t.Context(), "node", filepath.Join(dir, "client.mjs"),
		filepath.Join(binDir, "kubectl-bashtask"), filepath.Join(clusterDir, "kubeconfig"), ns, "o1", "theirs")
	out, err := cmd.CombinedOutput()
	t.Logf("client.mjs:\n%s", out)
	if err != nil {
		t.Fatalf("the TypeScript client failed: %v", err)
	}
	waitTaskCancelled(t, ns, "sleep 300")
	// The owner the model gave (someone-else) was ignored: every task of
	// the session, the forks' included, is the server's owner's.
	var tasks v1.BashTaskList
	if err := k8s.List(t.Context(), &tasks, client.InNamespace(ns)); err != nil || len(tasks.Items) == 0 {
		t.Fatalf("the session's tasks: %d (%v)", len(tasks.Items), err)
	}
	for _, task := range tasks.Items {
		if o := ptr.Deref(task.Spec.Owner, ""); o != "o1" {
			t.Errorf("task %s (%q): owner %q, want the server's o1", task.Name, task.Spec.Command, o)
		}
	}

	// The session of docs/mcp.md.
	cmd = exec.CommandContext(t.Context(), "node", filepath.Join(dir, "transcript.mjs"),
		filepath.Join(binDir, "kubectl-bashtask"), filepath.Join(clusterDir, "kubeconfig"), ns, "agent-7")
	out, err = cmd.CombinedOutput()
	t.Logf("transcript.mjs:\n%s", out)
	if err != nil {
		t.Fatalf("the session of docs/mcp.md failed: %v", err)
	}
}

// waitTaskCancelled waits until the task of command in ns ended
// Cancelled.
func waitTaskCancelled(t *testing.T, ns, command string) {
	t.Helper()
	for deadline := time.Now().Add(time.Minute); ; {
		var tasks v1.BashTaskList
		if err := k8s.List(t.Context(), &tasks, client.InNamespace(ns)); err != nil {
			t.Fatal(err)
		}
		i := slices.IndexFunc(tasks.Items, func(x v1.BashTask) bool { return x.Spec.Command == command })
		if i >= 0 && ptr.Deref(tasks.Items[i].Status.Reason, "") == v1.ReasonCancelled {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the task of the aborted request (%q) did not end Cancelled within a minute", command)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// TestMCPInspectorCLI lists the tools and calls one through the MCP
// Inspector's CLI mode.
func TestMCPInspectorCLI(t *testing.T) {
	dir := mcpClientsDir(t)
	ns := newNamespace(t)
	inspector := func(args ...string) string {
		t.Helper()
		base := []string{"--cli", filepath.Join(binDir, "kubectl-bashtask"), "--kubeconfig", filepath.Join(clusterDir, "kubeconfig"), "-n", ns, "mcp", "--owner", "o1"}
		cmd := exec.CommandContext(t.Context(), filepath.Join(dir, "node_modules", ".bin", "mcp-inspector"), append(base, args...)...)
		cmd.Env = append(os.Environ(), "MCP_CATALOG_PATH="+filepath.Join(t.TempDir(), "mcp.json"))
		out, _ := cmd.CombinedOutput()
		return string(out)
	}
	if out := inspector("--method", "tools/list"); !strings.Contains(out, `"name": "workspace_create"`) || !strings.Contains(out, `"name": "run"`) {
		t.Errorf("inspector tools/list:\n%s", out)
	}
	// A call whose error a model can act on: the workspace is missing.
	if out := inspector("--method", "tools/call", "--tool-name", "run", "--tool-arg", "workspace=nope", "command=echo hi"); !strings.Contains(out, `bashworkspaces.bashtask.dev \"nope\" not found`) {
		t.Errorf("inspector tools/call run in a missing workspace:\n%s", out)
	}
}

// TestMCPHTTPIdentity serves Streamable HTTP without credentials of its
// own, as the chart runs it, and calls it with bearer tokens: none and an
// unknown one are refused (401); a ServiceAccount of another namespace is
// authenticated but RBAC refuses its every call (workspace_fork too); a
// ServiceAccount with a Role in the namespace runs its command and forks.
func TestMCPHTTPIdentity(t *testing.T) {
	needWorkspaces(t)
	ns, other := newNamespace(t), newNamespace(t)
	createWorkspace(t, ns, "h1", "--owner", "o1", "--network", "None")
	cs := adminClientset(t)
	member := serviceAccountToken(t, cs, ns, "member", true)
	intruder := serviceAccountToken(t, cs, other, "intruder", false)
	url := startMCPHTTP(t, ns)

	if _, err := httpSession(t, url, ""); err == nil {
		t.Error("a session without a bearer token was accepted")
	}
	if _, err := httpSession(t, url, "not-a-token"); err == nil {
		t.Error("a session with a token the API server does not know was accepted")
	}
	s, err := httpSession(t, url, intruder)
	if err != nil {
		t.Fatalf("the intruder's session (authenticated, not authorized): %v", err)
	}
	mustRefuse(t, s, "run", map[string]any{"workspace": "h1", "command": "echo intruder"}, "forbidden")
	mustRefuse(t, s, "workspace_delete", map[string]any{"name": "h1"}, "forbidden")
	mustRefuse(t, s, "workspace_fork", map[string]any{"source": "h1"}, "forbidden")
	if s, err = httpSession(t, url, member); err != nil {
		t.Fatalf("the member's session: %v", err)
	}
	var r mcpRun
	mustCall(t, s, "run", map[string]any{"workspace": "h1", "command": "echo member"}, &r)
	if r.ExitCode != 0 || r.Stdout != "member\n" {
		t.Errorf("the member's run: %+v", r)
	}
	var f struct{ Workspaces []mcpWorkspace }
	mustCall(t, s, "workspace_fork", map[string]any{"source": "h1"}, &f)
	if len(f.Workspaces) != 1 || f.Workspaces[0].Phase != string(v1.WorkspaceReady) {
		t.Fatalf("the member's fork: %+v", f)
	}
	mustCall(t, s, "workspace_delete", map[string]any{"name": f.Workspaces[0].Name}, nil)
}

func adminClientset(t *testing.T) *kubernetes.Clientset {
	t.Helper()
	cfg, err := clientcmd.BuildConfigFromFlags("", filepath.Join(clusterDir, "kubeconfig"))
	if err != nil {
		t.Fatal(err)
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return cs
}

// serviceAccountToken makes a ServiceAccount (with a Role to use
// workspaces in ns when allowed) and returns a token of it.
func serviceAccountToken(t *testing.T, cs *kubernetes.Clientset, ns, name string, allowed bool) string {
	t.Helper()
	ctx := t.Context()
	if _, err := cs.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if allowed {
		role := &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: name}, Rules: []rbacv1.PolicyRule{
			{APIGroups: []string{"bashtask.dev"}, Resources: []string{"bashworkspaces", "bashtasks"}, Verbs: []string{"get", "list", "watch", "create", "patch", "delete"}},
			{APIGroups: []string{"output.bashtask.dev"}, Resources: []string{"bashtasks/log"}, Verbs: []string{"get"}},
			{APIGroups: []string{"output.bashtask.dev"}, Resources: []string{"bashtasks/stdin"}, Verbs: []string{"create"}},
		}}
		if _, err := cs.RbacV1().Roles(ns).Create(ctx, role, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		rb := &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: name},
			RoleRef:  rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "Role", Name: name},
			Subjects: []rbacv1.Subject{{Kind: "ServiceAccount", Name: name, Namespace: ns}}}
		if _, err := cs.RbacV1().RoleBindings(ns).Create(ctx, rb, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	tr, err := cs.CoreV1().ServiceAccounts(ns).CreateToken(ctx, name, &authnv1.TokenRequest{Spec: authnv1.TokenRequestSpec{ExpirationSeconds: ptr.To[int64](3600)}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("a token of ServiceAccount %s/%s: %v", ns, name, err)
	}
	return tr.Status.Token
}

// startMCPHTTP runs `kubectl-bashtask mcp --http` on a free port, as the
// chart's mcp values run it: no kubeconfig and no credentials, only the
// API server's URL (--server) and CA (--certificate-authority). It
// returns its URL once it listens.
func startMCPHTTP(t *testing.T, ns string) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	_ = l.Close()
	server, caFile := apiServerAndCA(t)
	ctx, cancel := context.WithCancel(context.Background())
	cmd := exec.CommandContext(ctx, filepath.Join(binDir, "kubectl-bashtask"), "--server", server, "--certificate-authority", caFile,
		"-n", ns, "mcp", "--owner", "o1", "--http", addr)
	cmd.Env = append(os.Environ(), "KUBECONFIG=", "HOME="+t.TempDir())
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cancel(); _ = cmd.Wait() })
	for deadline := time.Now().Add(30 * time.Second); ; {
		if c, err := net.Dial("tcp", addr); err == nil {
			_ = c.Close()
			return "http://" + addr
		}
		if time.Now().After(deadline) {
			t.Fatalf("kubectl-bashtask mcp --http %s does not listen", addr)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// apiServerAndCA returns the cluster's API server URL and a file of its
// CA, from the administrator's kubeconfig.
func apiServerAndCA(t *testing.T) (server, caFile string) {
	t.Helper()
	cfg, err := clientcmd.BuildConfigFromFlags("", filepath.Join(clusterDir, "kubeconfig"))
	if err != nil {
		t.Fatal(err)
	}
	caFile = cfg.CAFile
	if len(cfg.CAData) > 0 {
		caFile = filepath.Join(t.TempDir(), "ca.crt")
		if err := os.WriteFile(caFile, cfg.CAData, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return cfg.Host, caFile
}

// bearer adds a bearer token to each request.
type bearer struct {
	token string
	next  http.RoundTripper
}

func (b bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	if b.token != "" {
		r.Header.Set("Authorization", "Bearer "+b.token)
	}
	return b.next.RoundTrip(r)
}

func httpSession(t *testing.T, url, token string) (*mcp.ClientSession, error) {
	t.Helper()
	c := mcp.NewClient(&mcp.Implementation{Name: "e2e-http", Version: "v0"}, nil)
	tr := &mcp.StreamableClientTransport{Endpoint: url, HTTPClient: &http.Client{Transport: bearer{token, http.DefaultTransport}}, MaxRetries: -1}
	s, err := c.Connect(t.Context(), tr, nil)
	if err != nil {
		return nil, fmt.Errorf("connecting with token %q: %w", token, err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s, nil
}
