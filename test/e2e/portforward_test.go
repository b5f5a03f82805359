package e2e

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/portforward"
	"k8s.io/client-go/transport/spdy"
	"k8s.io/utils/ptr"
	ctrlclient "sigs.k8s.io/controller-runtime/pkg/client"

	outputv1alpha1 "github.com/bashtask/bashtask-operator/api/output/v1alpha1"
	v1 "github.com/bashtask/bashtask-operator/api/v1alpha1"
	"github.com/bashtask/bashtask-operator/client"
	"github.com/bashtask/bashtask-operator/internal/rig/syncbuf"
)

// httpServerTask starts `python3 -m http.server 8000` on the loopback of
// workspace ws, serving an index.html that says body, and waits until it
// listens.
func httpServerTask(t *testing.T, ns, ws, body string) {
	t.Helper()
	bt := createTask(t, ns, ws+"-http", fmt.Sprintf(`echo %s > index.html && exec /usr/bin/python3 -u -m http.server 8000 --bind 127.0.0.1`, body),
		func(bt *v1.BashTask) { bt.Spec.Workspace = ptr.To(ws) })
	for deadline := time.Now().Add(time.Minute); ; {
		var cur v1.BashTask
		if err := k8s.Get(t.Context(), ctrlclient.ObjectKeyFromObject(bt), &cur); err != nil {
			t.Fatal(err)
		}
		if cur.Status.Stdout != nil && strings.Contains(ptr.Deref(cur.Status.Stdout.Tail, ""), "Serving HTTP") {
			return
		}
		if cur.Status.Reason != nil || time.Now().After(deadline) {
			t.Fatalf("the HTTP server in %s did not listen: %+v", ws, cur.Status)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// pluginForward runs `kubectl bashtask port-forward ws :remote` (as user,
// when set) and returns the local port once it listens, or "" with the
// plugin's stderr when it ended first; done is closed when it exited.
func pluginForward(t *testing.T, ns, ws, user string, remote int) (local string, stderr *syncbuf.Buffer, done <-chan struct{}) {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	args := []string{"--kubeconfig", filepath.Join(clusterDir, "kubeconfig"), "-n", ns}
	if user != "" {
		args = append(args, "--as", user)
	}
	cmd := exec.CommandContext(ctx, filepath.Join(binDir, "kubectl-bashtask"), append(args, "port-forward", ws, fmt.Sprintf(":%d", remote))...)
	stderr = &syncbuf.Buffer{}
	cmd.Stderr = stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	t.Cleanup(func() { cancel(); <-exited })
	re := regexp.MustCompile(`Forwarding from 127\.0\.0\.1:(\d+) ->`)
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		if m := re.FindStringSubmatch(sc.Text()); m != nil {
			go func() { _, _ = io.Copy(io.Discard, out) }()
			return m[1], stderr, exited
		}
	}
	return "", stderr, exited
}

// refusedForward runs `kubectl bashtask port-forward` with args, which
// should end at once with a refusal; a forward that starts instead is cut
// after 30 s (exit -1).
func refusedForward(t *testing.T, args ...string) (stderr string, code int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	_, errOut, code := plugin(ctx, "", args...)
	return errOut, code
}

// fetch GETs url on a connection of its own.
func fetch(url string) (string, error) {
	c := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := c.Get(url)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("%s: %s", resp.Status, b)
	}
	return string(b), err
}

// TestPortForward: `python3 -m http.server` in a workspace fetched through
// the plugin's port-forward (many requests at once) and the Go client's;
// a port the workspace does not listen on is refused with connection
// refused even when another workspace listens there; a workspace of
// network Node is refused.
func TestPortForward(t *testing.T) {
	needWorkspaces(t)
	ns := newNamespace(t)
	createWorkspace(t, ns, "pf1", "--network", "None")
	createWorkspace(t, ns, "pf2", "--network", "None")
	httpServerTask(t, ns, "pf1", "hello-from-pf1")

	local, stderr, _ := pluginForward(t, ns, "pf1", "", 8000)
	if local == "" {
		t.Fatalf("port-forward pf1 did not listen: %s", stderr.String())
	}
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Go(func() {
			if got, err := fetch("http://127.0.0.1:" + local + "/index.html"); err != nil || got != "hello-from-pf1\n" {
				t.Errorf("request %d through the plugin: %q %v", i, got, err)
			}
		})
	}
	wg.Wait()

	t.Run("the Go client", func(t *testing.T) {
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		ready := make(chan []client.ForwardedPort, 1)
		done := make(chan error, 1)
		go func() {
			done <- outputClient(t, adminConfig(t)).PortForward(ctx, ns, "pf1", []string{"0:8000"}, client.PortForwardOptions{
				Ready: func(p []client.ForwardedPort) { ready <- p },
			})
		}()
		select {
		case p := <-ready:
			if got, err := fetch(fmt.Sprintf("http://127.0.0.1:%d/index.html", p[0].Local)); err != nil || got != "hello-from-pf1\n" {
				t.Errorf("through the client: %q %v", got, err)
			}
		case err := <-done:
			t.Fatalf("PortForward ended before it listened: %v", err)
		}
		cancel()
		if err := <-done; err != nil {
			t.Errorf("PortForward after its context ended: %v", err)
		}
	})
	t.Run("SPDY, as clients before the WebSocket tunneling", func(t *testing.T) {
		local := spdyForward(t, ns, "pf1", 8000)
		if got, err := fetch(fmt.Sprintf("http://127.0.0.1:%d/index.html", local)); err != nil || got != "hello-from-pf1\n" {
			t.Errorf("through SPDY: %q %v", got, err)
		}
	})
	t.Run("not another workspace's port", func(t *testing.T) {
		local, stderr, done := pluginForward(t, ns, "pf2", "", 8000)
		if local == "" {
			t.Fatalf("port-forward pf2 did not listen: %s", stderr.String())
		}
		if got, err := fetch("http://127.0.0.1:" + local + "/index.html"); err == nil {
			t.Fatalf("pf2's port 8000 answered %q: it reached pf1's server", got)
		}
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			t.Fatal("the plugin did not end after the refused connection")
		}
		if !strings.Contains(stderr.String(), "connection refused") {
			t.Errorf("stderr %q does not say connection refused", stderr.String())
		}
	})
	t.Run("a workspace of network Node", func(t *testing.T) {
		createWorkspace(t, ns, "pfnode", "--network", "Node")
		errOut, code := refusedForward(t, "-n", ns, "port-forward", "pfnode", ":8000")
		if code == 0 || !strings.Contains(errOut, "network Node") {
			t.Errorf("port-forward to a Node workspace: exit %d, stderr %q; want a refusal naming network Node", code, errOut)
		}
	})
	t.Run("bad ports", func(t *testing.T) {
		for _, p := range []string{"8080:0", "8080:65536", "70000:80"} {
			errOut, code := refusedForward(t, "-n", ns, "port-forward", "pf1", p)
			if code == 0 || !strings.Contains(errOut, "must be") {
				t.Errorf("port %s: exit %d, stderr %q; want a refusal naming the bound", p, code, errOut)
			}
		}
	})
}

// TestPortForwardAuthorization: port-forward takes create (and get, for
// the WebSocket) on bashworkspaces/portforward of output.bashtask.dev; a
// user who may read the workspace and the task output but not that
// subresource is refused, and so is one with get alone.
func TestPortForwardAuthorization(t *testing.T) {
	needWorkspaces(t)
	ns := newNamespace(t)
	createWorkspace(t, ns, "pfa", "--network", "None")
	httpServerTask(t, ns, "pfa", "hello-from-pfa")
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
	read := rbacv1.PolicyRule{APIGroups: []string{"bashtask.dev"}, Resources: []string{"bashworkspaces", "bashtasks"}, Verbs: []string{"get", "list", "watch"}}
	logs := rbacv1.PolicyRule{APIGroups: []string{"output.bashtask.dev"}, Resources: []string{"bashtasks/log"}, Verbs: []string{"get"}}
	pf := rbacv1.PolicyRule{APIGroups: []string{"output.bashtask.dev"}, Resources: []string{"bashworkspaces/portforward"}, Verbs: []string{"get", "create"}}
	getOnly := rbacv1.PolicyRule{APIGroups: []string{"output.bashtask.dev"}, Resources: []string{"bashworkspaces/portforward"}, Verbs: []string{"get"}}
	grant("e2e-pf-allowed", read, pf)
	grant("e2e-pf-reader", read, logs)
	grant("e2e-pf-get-only", read, getOnly)
	// RBAC reaches the authorizers' caches within a moment.
	for deadline := time.Now().Add(30 * time.Second); ; {
		local, stderr, _ := pluginForward(t, ns, "pfa", "e2e-pf-allowed", 8000)
		if local != "" {
			if got, err := fetch("http://127.0.0.1:" + local + "/index.html"); err != nil || got != "hello-from-pfa\n" {
				t.Fatalf("as a user with bashworkspaces/portforward: %q %v (%s)", got, err, stderr.String())
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("port-forward as a user with bashworkspaces/portforward: %s", stderr.String())
		}
		time.Sleep(200 * time.Millisecond)
	}
	errOut, code := refusedForward(t, "-n", ns, "--as", "e2e-pf-reader", "port-forward", "pfa", ":8000")
	if code == 0 || !strings.Contains(errOut, "bashworkspaces/portforward") || !strings.Contains(strings.ToLower(errOut), "forbidden") {
		t.Errorf("port-forward as a user without bashworkspaces/portforward: exit %d, stderr %q; want forbidden naming the subresource", code, errOut)
	}
	// The WebSocket is a GET, authorized as get first; create is checked
	// on top, as kube-apiserver does for pods/portforward.
	errOut, code = refusedForward(t, "-n", ns, "--as", "e2e-pf-get-only", "port-forward", "pfa", ":8000")
	if code == 0 || !strings.Contains(errOut, "create") || !strings.Contains(strings.ToLower(errOut), "forbidden") {
		t.Errorf("port-forward as a user with get but not create on bashworkspaces/portforward: exit %d, stderr %q; want forbidden naming create", code, errOut)
	}
}

// spdyForward forwards a free local port to remote of workspace ws over
// SPDY alone (a POST upgraded to SPDY/3.1, what kubectl port-forward spoke
// before it tunneled SPDY through a WebSocket), and returns the local port
// once it listens; the test's end stops it.
func spdyForward(t *testing.T, ns, ws string, remote int) uint16 {
	t.Helper()
	cfg := adminConfig(t)
	rt, upgrader, err := spdy.RoundTripperFor(cfg)
	if err != nil {
		t.Fatal(err)
	}
	u, err := url.Parse(cfg.Host)
	if err != nil {
		t.Fatal(err)
	}
	u.Path = path.Join("/apis", outputv1alpha1.Group, outputv1alpha1.Version, "namespaces", ns,
		outputv1alpha1.ResourceWorkspaces, ws, outputv1alpha1.SubresourcePortForward)
	dialer := spdy.NewDialer(upgrader, &http.Client{Transport: rt}, http.MethodPost, u)
	stop, ready := make(chan struct{}), make(chan struct{})
	fw, err := portforward.New(dialer, []string{fmt.Sprintf("0:%d", remote)}, stop, ready, io.Discard, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- fw.ForwardPorts() }()
	t.Cleanup(func() {
		close(stop)
		if err := <-done; err != nil {
			t.Errorf("the SPDY port-forward after its stop: %v", err)
		}
	})
	select {
	case <-ready:
	case err := <-done:
		t.Fatalf("the SPDY port-forward ended before it listened: %v", err)
	}
	ports, err := fw.GetPorts()
	if err != nil {
		t.Fatal(err)
	}
	return ports[0].Local
}
