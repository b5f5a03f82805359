package e2e

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/utils/ptr"
	ctrlclient "sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/bashtask/bashtask-operator/api/v1alpha1"
	"github.com/bashtask/bashtask-operator/client"
	"github.com/bashtask/bashtask-operator/internal/rig/localcluster"
	"github.com/bashtask/bashtask-operator/internal/rig/testutil"
)

// adminConfig is the local cluster's administrator kubeconfig.
func adminConfig(t *testing.T) *rest.Config {
	t.Helper()
	return adminConfigIn(t, clusterDir)
}

// adminConfigIn is the administrator kubeconfig of the cluster in dir.
func adminConfigIn(t *testing.T, dir string) *rest.Config {
	t.Helper()
	cfg, err := clientcmd.BuildConfigFromFlags("", filepath.Join(dir, "kubeconfig"))
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

func outputClient(t *testing.T, cfg *rest.Config) *client.Client {
	t.Helper()
	c, err := client.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// readAll follows a stream to its end.
func readAll(t *testing.T, c *client.Client, ns, name, stream string, offset int64, follow bool) ([]byte, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	r, err := c.FollowLog(ctx, ns, name, client.LogOptions{Stream: stream, Offset: offset, Follow: follow})
	if err != nil {
		return nil, err
	}
	defer r.Close()
	return io.ReadAll(r)
}

func sha(b []byte) string { s := sha256.Sum256(b); return hex.EncodeToString(s[:]) }

func createTask(t *testing.T, ns, name, command string, mutate ...func(*v1.BashTask)) *v1.BashTask {
	t.Helper()
	bt := &v1.BashTask{}
	bt.Namespace, bt.Name = ns, name
	bt.Spec.Command = command
	for _, m := range mutate {
		m(bt)
	}
	if err := k8s.Create(t.Context(), bt); err != nil {
		t.Fatal(err)
	}
	return bt
}

// utf8Command prints 'línea N ✓' lines slowly for about a second and then
// 300 kB at once: more than the tail, so the stream is uploaded, and the
// first bytes arrive while the task runs.
const utf8Command = `for i in $(seq 1 40); do printf 'línea %d ✓\n' $i; sleep 0.03; done; head -c 300000 /dev/zero | tr '\0' 'é'`

// TestOutputFollow follows a running task from 0 and from an offset inside
// a two-byte character, then reads the ended task the same two ways; every
// read's bytes are the stream's, by the status's sha256.
func TestOutputFollow(t *testing.T) {
	ns := newNamespace(t)
	c := outputClient(t, adminConfig(t))
	bt := createTask(t, ns, "follow", utf8Command)

	type result struct {
		data []byte
		err  error
	}
	var wg sync.WaitGroup
	live := make([]result, 2)
	for i, off := range []int64{0, 2} { // offset 2 is inside 'í'
		wg.Go(func() {
			b, err := readAll(t, c, ns, bt.Name, "stdout", off, true)
			live[i] = result{b, err}
		})
	}
	wg.Wait()
	done := testutil.WaitTerminal(t, k8s, ns, []string{bt.Name}, time.Minute)[bt.Name]
	want := ptr.Deref(done.Status.Stdout.SHA256, "")
	total := ptr.Deref(done.Status.Stdout.TotalBytes, 0)
	if live[0].err != nil || sha(live[0].data) != want || int64(len(live[0].data)) != total {
		t.Fatalf("followed from 0: %d bytes, %v; want %d bytes with sha256 %s", len(live[0].data), live[0].err, total, want)
	}
	full := live[0].data
	if !bytes.HasPrefix(full, []byte("línea 1 ✓\n")) {
		t.Errorf("stream starts %q", full[:20])
	}
	if live[1].err != nil || !bytes.Equal(live[1].data, full[2:]) {
		t.Errorf("followed from 2: %d bytes, %v; want the stream from 2", len(live[1].data), live[1].err)
	}
	// Ended: from the agent while it still holds the task, else from the
	// uploaded copy.
	for _, follow := range []bool{false, true} {
		b, err := readAll(t, c, ns, bt.Name, "stdout", 0, follow)
		if err != nil || sha(b) != want {
			t.Errorf("ended, follow=%v, from 0: %d bytes, %v", follow, len(b), err)
		}
		b, err = readAll(t, c, ns, bt.Name, "stdout", 2, follow)
		if err != nil || !bytes.Equal(b, full[2:]) {
			t.Errorf("ended, follow=%v, from 2: %d bytes, %v", follow, len(b), err)
		}
	}
	// Past the end: 416 naming the offset.
	_, err := readAll(t, c, ns, bt.Name, "stdout", total+1, false)
	if !isCode(err, http.StatusRequestedRangeNotSatisfiable) || !strings.Contains(err.Error(), fmt.Sprint(total+1)) {
		t.Errorf("past the end: %v, want 416 naming offset %d", err, total+1)
	}
	// The agent forgets the ended task; then the bucket serves it.
	waitForgotten(t, done)
	b, err := readAll(t, c, ns, bt.Name, "stdout", 2, false)
	if err != nil || !bytes.Equal(b, full[2:]) {
		t.Errorf("after the agent forgot it, from 2: %d bytes, %v", len(b), err)
	}
	// The stderr of the task is empty.
	if b, err := readAll(t, c, ns, bt.Name, "stderr", 0, true); err != nil || len(b) != 0 {
		t.Errorf("stderr: %q, %v", b, err)
	}
}

func isCode(err error, code int32) bool {
	var se *apierrors.StatusError
	return errors.As(err, &se) && se.ErrStatus.Code == code
}

// waitForgotten waits until the task's agent dropped its spill directory.
func waitForgotten(t *testing.T, bt *v1.BashTask) {
	t.Helper()
	waitForgottenIn(t, clusterDir, bt)
}

// waitForgottenIn is waitForgotten in the cluster of dir.
func waitForgottenIn(t *testing.T, cluster string, bt *v1.BashTask) {
	t.Helper()
	dir := filepath.Join(cluster, "agents", ptr.Deref(bt.Status.NodeName, ""), "tasks", string(bt.UID))
	testutil.WaitFor(t, "the agent drops "+dir, time.Minute, func() error {
		if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("still there (stat: %w)", err)
		}
		return nil
	})
}

// cuttingTransport fails each response's body after cutAfter bytes, the
// first cuts times: a connection lost mid-stream.
type cuttingTransport struct {
	rt       http.RoundTripper
	cutAfter int64
	mu       sync.Mutex
	cuts     int
}

var errCut = errors.New("connection cut by the test")

func (c *cuttingTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := c.rt.RoundTrip(req)
	if err != nil || !strings.HasSuffix(req.URL.Path, "/log") {
		return resp, err
	}
	c.mu.Lock()
	cut := c.cuts > 0
	if cut {
		c.cuts--
	}
	c.mu.Unlock()
	if cut {
		resp.Body = &cutBody{ReadCloser: resp.Body, left: c.cutAfter}
	}
	return resp, nil
}

type cutBody struct {
	io.ReadCloser
	left int64
}

func (b *cutBody) Read(p []byte) (int, error) {
	if b.left <= 0 {
		_ = b.Close()
		return 0, errCut
	}
	if int64(len(p)) > b.left {
		p = p[:b.left]
	}
	n, err := b.ReadCloser.Read(p)
	b.left -= int64(n)
	return n, err
}

// TestOutputReconnect cuts the connection twice in the middle of a
// followed stream: the client resumes at its offset, no byte lost or
// repeated.
func TestOutputReconnect(t *testing.T) {
	ns := newNamespace(t)
	cfg := adminConfig(t)
	cut := &cuttingTransport{cutAfter: 100001, cuts: 2}
	cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper { cut.rt = rt; return cut })
	c := outputClient(t, cfg)
	bt := createTask(t, ns, "reconnect", `for i in $(seq 1 20); do printf 'línea %d\n' $i; sleep 0.02; done; head -c 400000 /dev/urandom | base64`)
	b, err := readAll(t, c, ns, bt.Name, "stdout", 0, true)
	done := testutil.WaitTerminal(t, k8s, ns, []string{bt.Name}, time.Minute)[bt.Name]
	if err != nil || sha(b) != ptr.Deref(done.Status.Stdout.SHA256, "") {
		t.Fatalf("followed with two cuts: %d bytes, %v; want %d", len(b), err, ptr.Deref(done.Status.Stdout.TotalBytes, 0))
	}
	if cut.cuts != 0 {
		t.Errorf("%d cuts left: the stream was shorter than the test meant", cut.cuts)
	}
}

// TestOutputPastSpillLimit reads a stream longer than its spill limit:
// the kept bytes, then the error naming the offset, mid-response (the
// trailer, which must survive kube-apiserver's proxy) and at the start
// (410).
func TestOutputPastSpillLimit(t *testing.T) {
	ns := newNamespace(t)
	c := outputClient(t, adminConfig(t))
	bt := createTask(t, ns, "spill", `head -c 200000 /dev/zero | tr '\0' x`, func(bt *v1.BashTask) {
		bt.Spec.Output = &v1.OutputSpec{SpillLimitBytes: ptr.To(int64(150000))}
	})
	testutil.WaitTerminal(t, k8s, ns, []string{bt.Name}, time.Minute)
	for _, follow := range []bool{false, true} {
		b, err := readAll(t, c, ns, bt.Name, "stdout", 100, follow)
		var se *client.StreamError
		if int64(len(b)) != 150000-100 || !errors.As(err, &se) || se.Offset != 150000 || !strings.Contains(se.Message, "150000") {
			t.Errorf("follow=%v from 100: %d bytes, %v; want 149900 then the error at offset 150000", follow, len(b), err)
		}
	}
	_, err := readAll(t, c, ns, bt.Name, "stdout", 160000, false)
	if !isCode(err, http.StatusGone) || !strings.Contains(err.Error(), "160000") {
		t.Errorf("from 160000: %v, want 410 naming the offset", err)
	}
}

// TestOutputAuthorization: RBAC on bashtasks/log of output.bashtask.dev
// decides, as for pods/log; the server itself refuses requests that do not
// come through kube-apiserver's front proxy.
func TestOutputAuthorization(t *testing.T) {
	ns, other := newNamespace(t), newNamespace(t)
	bt := createTask(t, ns, "secret-output", `echo hunter2`)
	testutil.WaitTerminal(t, k8s, ns, []string{bt.Name}, time.Minute)
	grant := func(ns, user string, rules ...rbacv1.PolicyRule) {
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
	getTasks := rbacv1.PolicyRule{APIGroups: []string{"bashtask.dev", "output.bashtask.dev"}, Resources: []string{"bashtasks"}, Verbs: []string{"get", "list", "watch"}}
	getLog := rbacv1.PolicyRule{APIGroups: []string{"output.bashtask.dev"}, Resources: []string{"bashtasks/log"}, Verbs: []string{"get"}}
	grant(ns, "e2e-reader", getTasks, getLog)
	grant(ns, "e2e-no-log", getTasks)
	grant(other, "e2e-elsewhere", getTasks, getLog)
	as := func(user string) *client.Client {
		cfg := adminConfig(t)
		cfg.Impersonate = rest.ImpersonationConfig{UserName: user}
		return outputClient(t, cfg)
	}
	// RBAC propagates to the authorizer's cache within a moment.
	deadline := time.Now().Add(30 * time.Second)
	for {
		b, err := readAll(t, as("e2e-reader"), ns, bt.Name, "stdout", 0, false)
		if err == nil && string(b) == "hunter2\n" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("a user with get on bashtasks/log: %q, %v", b, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	for _, user := range []string{"e2e-no-log", "e2e-elsewhere"} {
		if _, err := readAll(t, as(user), ns, bt.Name, "stdout", 0, false); !isCode(err, http.StatusForbidden) {
			t.Errorf("%s: %v, want 403", user, err)
		}
	}
	anon := rest.AnonymousClientConfig(adminConfig(t))
	if _, err := readAll(t, outputClient(t, anon), ns, bt.Name, "stdout", 0, false); !isCode(err, http.StatusForbidden) && !isCode(err, http.StatusUnauthorized) {
		t.Errorf("anonymous: %v, want 401 or 403", err)
	}

	// Straight to the controller's port, past kube-apiserver: without the
	// front proxy's client certificate the request is anonymous, whatever
	// X-Remote-User says.
	var slice discoveryv1.EndpointSlice
	if err := k8s.Get(t.Context(), ctrlclient.ObjectKey{Namespace: localcluster.AgentNamespace, Name: localcluster.OutputAPIService + "-local"}, &slice); err != nil {
		t.Fatal(err)
	}
	url := fmt.Sprintf("https://127.0.0.1:%d/apis/output.bashtask.dev/v1alpha1/namespaces/%s/bashtasks/%s/log", *slice.Ports[0].Port, ns, bt.Name)
	req, _ := http.NewRequestWithContext(t.Context(), http.MethodGet, url, nil)
	req.Header.Set("X-Remote-User", "bashtask-admin")
	req.Header.Set("X-Remote-Group", "system:masters")
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}} //nolint:gosec // the test reaches the server, not its name
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusForbidden || bytes.Contains(body, []byte("hunter2")) {
		t.Errorf("direct request with forged headers: %s %s, want 403", resp.Status, body)
	}
}

// TestOutputTaskDeletedWhileFollowed: the follow ends, with what was
// printed before, once the task is deleted.
func TestOutputTaskDeletedWhileFollowed(t *testing.T) {
	ns := newNamespace(t)
	c := outputClient(t, adminConfig(t))
	bt := createTask(t, ns, "deleted", `echo before; sleep 120`)
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	r, err := c.FollowLog(ctx, ns, bt.Name, client.LogOptions{Follow: true})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	got := make([]byte, len("before\n"))
	if _, err := io.ReadFull(r, got); err != nil || string(got) != "before\n" {
		t.Fatalf("first line %q, %v", got, err)
	}
	if err := k8s.Delete(t.Context(), bt); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	after, err := io.ReadAll(r)
	var se *client.StreamError
	if len(after) != 0 || (err != nil && !errors.As(err, &se) && !apierrors.IsGone(err) && !apierrors.IsNotFound(err)) {
		t.Errorf("after the delete: %q, %v; want the end (clean or a StreamError)", after, err)
	}
	if took := time.Since(start); took > 30*time.Second {
		t.Errorf("the follow ended %s after the delete", took)
	}
	t.Logf("follow of a deleted task ended with %v", err)
}

// TestOutputAgentRestartedWhileFollowed: the agent is killed while a
// follower reads its task; the task ends AgentRestarted and the follower
// gets what was captured, then the end.
func TestOutputAgentRestartedWhileFollowed(t *testing.T) {
	ns := newNamespace(t)
	c := outputClient(t, adminConfig(t))
	bt := createTask(t, ns, "agent-restart", `echo before; sleep 60`, func(bt *v1.BashTask) { bt.Spec.NodeName = ptr.To("node-2") })
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	r, err := c.FollowLog(ctx, ns, bt.Name, client.LogOptions{Follow: true})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	got := make([]byte, len("before\n"))
	if _, err := io.ReadFull(r, got); err != nil || string(got) != "before\n" {
		t.Fatalf("first line %q, %v", got, err)
	}
	killComponent(t, "agent-node-2")
	after, err := io.ReadAll(r)
	if err != nil || len(after) != 0 {
		t.Errorf("after the agent restart: %q, %v; want the clean end", after, err)
	}
	done := testutil.WaitTerminal(t, k8s, ns, []string{bt.Name}, time.Minute)[bt.Name]
	if reason := ptr.Deref(done.Status.Reason, ""); reason != v1.ReasonAgentRestarted {
		t.Errorf("reason %s, want AgentRestarted", reason)
	}
}

// TestOutputNotKept: a stream whose agent has forgotten it, never uploaded
// and longer than its tail, is 410 from any offset before its end, and an
// empty, clean answer at its end (what a follower that read it all asks).
func TestOutputNotKept(t *testing.T) {
	ns := newNamespace(t)
	c := outputClient(t, adminConfig(t))
	bt := createTask(t, ns, "not-kept", `head -c 100000 /dev/zero | tr '\0' y`, func(bt *v1.BashTask) {
		bt.Spec.Output = &v1.OutputSpec{Upload: ptr.To(v1.UploadNever)}
	})
	done := testutil.WaitTerminal(t, k8s, ns, []string{bt.Name}, time.Minute)[bt.Name]
	waitForgotten(t, done)
	if _, err := readAll(t, c, ns, bt.Name, "stdout", 5, false); !isCode(err, http.StatusGone) || !strings.Contains(err.Error(), "offset 5") {
		t.Errorf("from 5: %v, want 410 naming the offset", err)
	}
	for _, follow := range []bool{false, true} {
		if b, err := readAll(t, c, ns, bt.Name, "stdout", 100000, follow); err != nil || len(b) != 0 {
			t.Errorf("at the end, follow=%v: %q, %v; want an empty clean end", follow, b, err)
		}
	}
}

// TestOutputNodeLocalBucket runs a cluster of its own as the chart's
// default installs it: the agents upload to a file:// bucket on their
// node and the controller has no --output-bucket-url, so it cannot read
// the uploaded copies. Once the agent forgot a finished task, its stream,
// longer than the tail, is still served whole through kube-apiserver: the
// node's agent reads it from its bucket. Bytes past the spill limit and a
// lost object are the same errors as from a bucket the controller reads.
func TestOutputNodeLocalBucket(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "cluster")
	lc, err := startCluster(dir, "--agents", "1", "--controller-arg=--output-bucket-url=")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			localcluster.WriteLogTails(t.Output(), dir, 40)
		}
		lc.stop()
	})
	kc, err := clusterClient(t.Context(), dir)
	if err != nil {
		t.Fatal(err)
	}
	nsObj := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "e2e-"}}
	if err := kc.Create(t.Context(), nsObj); err != nil {
		t.Fatal(err)
	}
	ns := nsObj.Name
	c := outputClient(t, adminConfigIn(t, dir))
	create := func(name, command string, mutate func(*v1.BashTask)) *v1.BashTask {
		bt := &v1.BashTask{}
		bt.Namespace, bt.Name = ns, name
		bt.Spec.Command = command
		if mutate != nil {
			mutate(bt)
		}
		if err := kc.Create(t.Context(), bt); err != nil {
			t.Fatal(err)
		}
		return bt
	}
	whole := create("whole", `printf 'línea ✓\n'; head -c 300000 /dev/urandom | base64`, nil)
	both := create("both", bigCombined, nil)
	cut := create("cut", `head -c 200000 /dev/zero | tr '\0' x`, func(bt *v1.BashTask) {
		bt.Spec.Output = &v1.OutputSpec{SpillLimitBytes: ptr.To(int64(150000))}
	})
	done := testutil.WaitTerminal(t, kc, ns, []string{whole.Name, cut.Name, both.Name}, 2*time.Minute)
	for name, bt := range done {
		waitForgottenIn(t, dir, bt)
		// The terminal status may come before the upload's: read the
		// task again once the upload is recorded.
		for deadline := time.Now().Add(time.Minute); !meta.IsStatusConditionTrue(bt.Status.Conditions, v1.ConditionOutputUploaded); {
			if time.Now().After(deadline) {
				t.Fatalf("%s: no OutputUploaded condition a minute after the agent forgot it: %+v", name, bt.Status.Conditions)
			}
			time.Sleep(100 * time.Millisecond)
			if err := kc.Get(t.Context(), ctrlclient.ObjectKeyFromObject(bt), bt); err != nil {
				t.Fatal(err)
			}
		}
	}

	// Both streams in their order: stdout's copy and the order journal
	// through the agent, stderr from its status tail.
	checkStoredCombined(t, c, ns, done[both.Name])

	bt := done[whole.Name]
	out := bt.Status.Stdout
	if out == nil || out.Spill == nil {
		t.Fatalf("stdout status %+v: no spill reference", out)
	}
	url := ptr.Deref(out.Spill.URL, "")
	if !strings.HasPrefix(url, "file://"+dir) {
		t.Fatalf("stdout's spill url %q, want an object of the node's file:// bucket", url)
	}
	want, total := ptr.Deref(out.SHA256, ""), ptr.Deref(out.TotalBytes, 0)
	if !ptr.Deref(out.Truncated, false) {
		t.Fatalf("stdout of %d bytes is not truncated: the test needs a stream longer than its tail", total)
	}
	var full []byte
	for _, follow := range []bool{false, true} {
		b, err := readAll(t, c, ns, bt.Name, "stdout", 0, follow)
		if err != nil || sha(b) != want || int64(len(b)) != total {
			t.Fatalf("follow=%v from 0: %d bytes, %v; want %d bytes with sha256 %s", follow, len(b), err, total, want)
		}
		full = b
	}
	if b, err := readAll(t, c, ns, bt.Name, "stdout", 2, false); err != nil || !bytes.Equal(b, full[2:]) { // inside 'í'
		t.Errorf("from 2: %d bytes, %v; want the stream from 2", len(b), err)
	}
	if _, err := readAll(t, c, ns, bt.Name, "stdout", total+1, false); !isCode(err, http.StatusRequestedRangeNotSatisfiable) {
		t.Errorf("past the end: %v, want 416", err)
	}

	// Past the spill limit: the kept bytes, then the error at the limit
	// (a trailer), and a 410 from beyond it.
	b, err := readAll(t, c, ns, cut.Name, "stdout", 100, true)
	var se *client.StreamError
	if int64(len(b)) != 150000-100 || !errors.As(err, &se) || se.Offset != 150000 || !strings.Contains(se.Message, "150000") {
		t.Errorf("past the spill limit, from 100: %d bytes, %v; want 149900 then the error at offset 150000", len(b), err)
	}
	if _, err := readAll(t, c, ns, cut.Name, "stdout", 160000, false); !isCode(err, http.StatusGone) || !strings.Contains(err.Error(), "160000") {
		t.Errorf("past the spill limit, from 160000: %v, want 410 naming the offset", err)
	}

	// The object lost: 410 naming the offset, and which agent looked.
	key := strings.TrimPrefix(url, "file://"+filepath.Join(dir, "objects")+"/")
	if err := os.Remove(filepath.Join(dir, "objects", filepath.FromSlash(key))); err != nil {
		t.Fatal(err)
	}
	if _, err := readAll(t, c, ns, bt.Name, "stdout", 7, true); !isCode(err, http.StatusGone) || !strings.Contains(err.Error(), "offset 7") ||
		!strings.Contains(err.Error(), "missing") {
		t.Errorf("the object removed, from 7: %v, want 410 naming the offset and the missing copy", err)
	}
}
