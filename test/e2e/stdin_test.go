package e2e

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	ctrlclient "sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/bashtask/bashtask-operator/api/v1alpha1"
	"github.com/bashtask/bashtask-operator/client"
	"github.com/bashtask/bashtask-operator/internal/rig/testutil"
)

func streamed(idleSeconds int32) func(*v1.BashTask) {
	return func(bt *v1.BashTask) {
		bt.Spec.StdinStream = &v1.StdinStream{IdleTimeoutSeconds: ptr.To(idleSeconds)}
	}
}

// answerDropper loses the answers of the first drops stdin requests that
// carry bytes: each reaches the server and is applied, and then the
// client sees a broken connection, as when one breaks after the request
// was sent.
type answerDropper struct {
	rt    http.RoundTripper
	mu    sync.Mutex
	drops int
}

func (d *answerDropper) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := d.rt.RoundTrip(req)
	if err != nil || !strings.HasSuffix(req.URL.Path, "/stdin") || req.ContentLength == 0 {
		return resp, err
	}
	d.mu.Lock()
	drop := d.drops > 0
	if drop {
		d.drops--
	}
	d.mu.Unlock()
	if drop {
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
		return nil, errCut
	}
	return resp, nil
}

// rawStdin makes one bashtasks/stdin request as the administrator.
func rawStdin(t *testing.T, hc *http.Client, cfg *rest.Config, ns, name string, offset int64, body []byte, closeAfter bool) (*rawAnswer, string) {
	t.Helper()
	u := fmt.Sprintf("%s/apis/output.bashtask.dev/v1alpha1/namespaces/%s/bashtasks/%s/stdin?offset=%d&close=%v", cfg.Host, ns, name, offset, closeAfter)
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, u, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/octet-stream")
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return &rawAnswer{StatusCode: resp.StatusCode, Status: resp.Status, Header: resp.Header}, string(b)
}

// rawAnswer is what rawStdin got, the body read and closed.
type rawAnswer struct {
	StatusCode int
	Status     string
	Header     http.Header
}

// TestStdinStreamThroughAPI feeds `cat` through kube-apiserver: the
// writer's answers are lost twice and it resumes at the offset the server
// accepted, an overlapping resend is written once, a gap is 409, a body
// over 4 MiB is 413, a task without spec.stdinStream is 400, and the close
// is the command's EOF.
func TestStdinStreamThroughAPI(t *testing.T) {
	ns := newNamespace(t)
	cfg := adminConfig(t)
	drop := &answerDropper{drops: 2}
	cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper { drop.rt = rt; return drop })
	c := outputClient(t, cfg)
	bt := createTask(t, ns, "cat", `test -p /dev/stdin && cat; echo "[eof $?]"`, streamed(60))
	plain := createTask(t, ns, "plain", `sleep 30`)

	w, err := c.Stdin(t.Context(), ns, bt.Name)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Write([]byte("hello ")); err != nil {
		t.Fatalf("write with the answer lost: %v", err)
	}
	if _, err := w.Write([]byte("wor")); err != nil {
		t.Fatalf("second write with the answer lost: %v", err)
	}
	if drop.drops != 0 || w.Offset() != 9 {
		t.Fatalf("%d drops left, offset %d: want 0 and 9", drop.drops, w.Offset())
	}

	admin := adminConfig(t)
	hc, err := rest.HTTPClientFor(admin)
	if err != nil {
		t.Fatal(err)
	}
	// A client unsure of what arrived resends from 3: only "ld" is new.
	resp, body := rawStdin(t, hc, admin, ns, bt.Name, 3, []byte("lo world"), false)
	if resp.StatusCode != http.StatusOK || resp.Header.Get(client.HeaderStdinOffset) != "11" || resp.Header.Get(client.HeaderStdinClosed) != "false" {
		t.Fatalf("overlapping resend: %s %v %s", resp.Status, resp.Header, body)
	}
	resp, body = rawStdin(t, hc, admin, ns, bt.Name, 20, []byte("x"), false)
	if resp.StatusCode != http.StatusConflict || !strings.Contains(body, "20") || !strings.Contains(body, "11") || resp.Header.Get(client.HeaderStdinOffset) != "11" {
		t.Fatalf("a gap: %s %s", resp.Status, body)
	}
	resp, body = rawStdin(t, hc, admin, ns, bt.Name, 11, make([]byte, client.StdinRequestBytes+1), false)
	if resp.StatusCode != http.StatusRequestEntityTooLarge || !strings.Contains(body, strconv.Itoa(client.StdinRequestBytes)) {
		t.Fatalf("over 4 MiB: %s %s", resp.Status, body)
	}
	resp, body = rawStdin(t, hc, admin, ns, plain.Name, 0, []byte("x"), false)
	if resp.StatusCode != http.StatusBadRequest || !strings.Contains(body, "spec.stdinStream") {
		t.Fatalf("a task without spec.stdinStream: %s %s", resp.Status, body)
	}

	w2, err := c.Stdin(t.Context(), ns, bt.Name)
	if err != nil || w2.Offset() != 11 {
		t.Fatalf("a new writer: offset %v, %v; want 11", w2, err)
	}
	if _, err := w2.Write([]byte("!\n")); err != nil {
		t.Fatal(err)
	}
	if err := w2.Close(); err != nil {
		t.Fatal(err)
	}
	// Refused as closed, or as ended when `cat` was quicker.
	var ce *client.StdinClosedError
	if _, err := w2.Write([]byte("late")); (!errors.As(err, &ce) || ce.Reason != client.StdinReasonClosed) && !isCode(err, http.StatusGone) {
		t.Fatalf("a write after the close: %v", err)
	}
	done := testutil.WaitTerminal(t, k8s, ns, []string{bt.Name}, time.Minute)[bt.Name]
	if got := ptr.Deref(done.Status.Stdout.Tail, ""); got != "hello world!\n[eof 0]\n" || ptr.Deref(done.Status.Reason, "") != v1.ReasonSucceeded {
		t.Fatalf("stdout %q, reason %v", got, ptr.Deref(done.Status.Reason, ""))
	}
	if in := done.Status.Stdin; in == nil || ptr.Deref(in.Reason, "") != v1.StdinClosed || ptr.Deref(in.AcceptedBytes, -1) != 13 {
		t.Fatalf("status.stdin %+v, want 13 bytes, Closed", in)
	}
	if _, err := w2.Write([]byte("later")); err == nil {
		t.Fatal("a write to an ended task succeeded")
	}
	if err := k8s.Delete(t.Context(), plain); err != nil {
		t.Fatal(err)
	}
}

// TestStdinStreamIdleTimeout: nobody writes, and after
// idleTimeoutSeconds the command reads EOF and ends long before its
// timeout.
func TestStdinStreamIdleTimeout(t *testing.T) {
	ns := newNamespace(t)
	bt := createTask(t, ns, "forgotten", `cat; echo "[eof]"`, streamed(1), func(bt *v1.BashTask) { bt.Spec.TimeoutSeconds = ptr.To(int32(300)) })
	done := testutil.WaitTerminal(t, k8s, ns, []string{bt.Name}, 2*time.Minute)[bt.Name]
	if got := ptr.Deref(done.Status.Stdout.Tail, ""); got != "[eof]\n" || ptr.Deref(done.Status.Reason, "") != v1.ReasonSucceeded {
		t.Fatalf("stdout %q, reason %v: want [eof] and Succeeded", got, ptr.Deref(done.Status.Reason, ""))
	}
	if in := done.Status.Stdin; in == nil || ptr.Deref(in.Reason, "") != v1.StdinIdleTimeout || !ptr.Deref(in.Closed, false) || ptr.Deref(in.AcceptedBytes, -1) != 0 {
		t.Fatalf("status.stdin %+v, want closed by IdleTimeout after 0 bytes", in)
	}
	c := outputClient(t, adminConfig(t))
	if _, err := c.Stdin(t.Context(), ns, bt.Name); !isCode(err, http.StatusGone) {
		t.Fatalf("a writer of an ended task: %v, want 410", err)
	}
}

// TestStdinAuthorization: writing takes create on bashtasks/stdin; get on
// bashtasks/log is not enough.
func TestStdinAuthorization(t *testing.T) {
	ns := newNamespace(t)
	bt := createTask(t, ns, "guarded", `cat`, streamed(60))
	grant := func(user string, rules ...rbacv1.PolicyRule) {
		role := &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: user}, Rules: rules}
		rb := &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: user},
			RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: user},
			Subjects: []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: user}}}
		for _, o := range []ctrlclient.Object{role, rb} {
			if err := k8s.Create(t.Context(), o); err != nil {
				t.Fatal(err)
			}
		}
	}
	grant("e2e-stdin-reader", rbacv1.PolicyRule{APIGroups: []string{"output.bashtask.dev"}, Resources: []string{"bashtasks/log"}, Verbs: []string{"get"}})
	grant("e2e-stdin-writer", rbacv1.PolicyRule{APIGroups: []string{"output.bashtask.dev"}, Resources: []string{"bashtasks/stdin"}, Verbs: []string{"create"}})
	as := func(user string) *client.Client {
		cfg := adminConfig(t)
		cfg.Impersonate = rest.ImpersonationConfig{UserName: user}
		return outputClient(t, cfg)
	}
	if _, err := as("e2e-stdin-reader").Stdin(t.Context(), ns, bt.Name); !isCode(err, http.StatusForbidden) {
		t.Fatalf("a reader writing stdin: %v, want 403", err)
	}
	w, err := as("e2e-stdin-writer").Stdin(t.Context(), ns, bt.Name)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Write([]byte("ok\n")); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	done := testutil.WaitTerminal(t, k8s, ns, []string{bt.Name}, time.Minute)[bt.Name]
	if got := ptr.Deref(done.Status.Stdout.Tail, ""); got != "ok\n" {
		t.Fatalf("stdout %q", got)
	}
}

// TestPluginRunStreamPython types into an interactive python3 through
// `kubectl bashtask run -i --stream` from a real terminal: the prompt
// shows, a typed line is answered, and Ctrl-D ends python and the plugin
// with exit code 0.
func TestPluginRunStreamPython(t *testing.T) {
	// The node is this host, and at the tenant level the task sees the
	// node's /usr.
	const python = "/usr/bin/python3"
	if _, err := os.Stat(python); err != nil {
		t.Skipf("no python3 on the node (%s: %v)", python, err)
	}
	ns := newNamespace(t)
	status := filepath.Join(t.TempDir(), "status")
	cmd := fmt.Sprintf("env KUBECONFIG=%s %s -n %s run -i --stream -- %s -q -i -u; echo \"plugin-exit=$?\" > %s; sleep 30",
		filepath.Join(clusterDir, "kubeconfig"), filepath.Join(binDir, "kubectl-bashtask"), ns, python, status)
	tm := startTmux(t, cmd)
	tm.waitFor(">>>")
	tm.send("print(6*7)", "Enter")
	tm.waitFor("42")
	tm.waitForN(">>>", 2)
	tm.send("import sys; print('py%d' % sys.version_info[0])", "Enter") // one write: the prompt on stderr cannot split it
	tm.waitFor("py3")
	tm.send("C-d")
	deadline := time.Now().Add(time.Minute)
	for {
		b, err := os.ReadFile(status)
		if err == nil && strings.TrimSpace(string(b)) != "" {
			if got := strings.TrimSpace(string(b)); got != "plugin-exit=0" {
				t.Fatalf("after Ctrl-D: %s\n%s", got, tm.screen())
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the plugin did not end within a minute of Ctrl-D:\n%s", tm.screen())
		}
		time.Sleep(100 * time.Millisecond)
	}
}
