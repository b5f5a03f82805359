package e2e

import (
	"bytes"
	"errors"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	ctrlclient "sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/bashtask/bashtask-operator/api/v1alpha1"
	"github.com/bashtask/bashtask-operator/client"
)

// requestLog notes the method and path of each request of a client.
type requestLog struct {
	mu   sync.Mutex
	reqs []string
}

func (l *requestLog) wrap(cfg *rest.Config) *rest.Config {
	cfg = rest.CopyConfig(cfg)
	cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper {
		return roundTripper(func(req *http.Request) (*http.Response, error) {
			l.mu.Lock()
			l.reqs = append(l.reqs, req.Method+" "+req.URL.Path+"?"+req.URL.RawQuery)
			l.mu.Unlock()
			return rt.RoundTrip(req)
		})
	})
	return cfg
}

func (l *requestLog) list() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.reqs...)
}

type roundTripper func(*http.Request) (*http.Response, error)

func (f roundTripper) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// timedNotes keeps what is written and when.
type timedNotes struct {
	mu     sync.Mutex
	buf    bytes.Buffer
	firsts map[string]time.Time
}

func (w *timedNotes) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.firsts == nil {
		w.firsts = map[string]time.Time{}
	}
	w.firsts[string(p)] = time.Now()
	return w.buf.Write(p)
}

// when returns when the first write containing s came.
func (w *timedNotes) when(s string) (time.Time, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	var first time.Time
	for text, at := range w.firsts {
		if strings.Contains(text, s) && (first.IsZero() || at.Before(first)) {
			first = at
		}
	}
	return first, !first.IsZero()
}

func (w *timedNotes) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.buf.String()
}

// TestClientRun: Run streams both outputs to writers and returns the exit
// code; the wait is one watch from the create (no read of the task after
// it, no poll) and the client asks for no discovery document.
func TestClientRun(t *testing.T) {
	ns := newNamespace(t)
	log := &requestLog{}
	c := outputClient(t, log.wrap(adminConfig(t)))
	for _, tc := range []struct {
		name, command, stdout, stderr string
		code                          int
		reason                        v1.Reason
	}{
		{"short", "echo out; echo err >&2; exit 3", "out\n", "err\n", 3, v1.ReasonNonZeroExit},
		// More than a status tail: read through the output API.
		{"long", "head -c 300000 /dev/zero | tr '\\0' a; echo; echo done >&2", strings.Repeat("a", 300000) + "\n", "done\n", 0, v1.ReasonSucceeded},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			res, err := c.Run(t.Context(), client.RunOptions{Namespace: ns, Command: tc.command, Stdout: &stdout, Stderr: &stderr, WaitTimeout: 2 * time.Minute})
			if err != nil {
				t.Fatalf("Run: %v", err)
			}
			if res.ExitCode != tc.code || res.Reason != tc.reason || stdout.String() != tc.stdout || stderr.String() != tc.stderr {
				t.Errorf("Run: exit %d %s, stdout %d bytes %.40q, stderr %q; want exit %d %s, %d bytes, %q", res.ExitCode, res.Reason,
					stdout.Len(), stdout.String(), stderr.String(), tc.code, tc.reason, len(tc.stdout), tc.stderr)
			}
			if ttl := ptr.Deref(res.Task.Spec.TTLSecondsAfterFinished, -1); ttl != 3600 {
				t.Errorf("spec.ttlSecondsAfterFinished %d, want DefaultTTL's 3600", ttl)
			}
		})
	}
	for _, r := range log.list() {
		path, query, _ := strings.Cut(strings.TrimPrefix(strings.TrimPrefix(r, "GET "), "POST "), "?")
		switch {
		case path == "/api" || path == "/apis" || strings.Count(path, "/") == 3 && strings.HasPrefix(path, "/apis/"):
			t.Errorf("a discovery request: %s", r)
		case strings.HasPrefix(r, "GET ") && strings.Contains(path, "/bashtasks") && !strings.Contains(query, "watch=true") && !strings.HasSuffix(path, "/log"):
			t.Errorf("a read of the task besides the watch: %s", r)
		}
	}
}

// TestClientStartReadByOffset: Start returns at once with the task
// running on; its output is read later from an offset, and Wait gives
// its end.
func TestClientStartReadByOffset(t *testing.T) {
	ns := newNamespace(t)
	c := outputClient(t, adminConfig(t))
	start := time.Now()
	task, err := c.Start(t.Context(), client.RunOptions{Namespace: ns, Command: "echo line1; echo line2; sleep 2; echo line3"})
	if err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d > time.Second {
		t.Errorf("Start took %v; it returns after the create", d)
	}
	got, err := readAll(t, c, ns, task.Name, "stdout", int64(len("line1\n")), true)
	if err != nil || string(got) != "line2\nline3\n" {
		t.Errorf("stdout from offset 6: %q, %v; want line2 and line3", got, err)
	}
	res, err := c.Wait(t.Context(), task, client.RunOptions{})
	if err != nil || res.ExitCode != 0 || res.Reason != v1.ReasonSucceeded {
		t.Errorf("Wait: %+v, %v", res, err)
	}
}

// TestClientRunNotesWhyItWaitsAndBoundsTheWait: a task for a workspace
// that does not exist waits; Run notes why within 2 s, and WaitTimeout
// ends the wait with a *WaitTimeoutError, the task cancelled.
func TestClientRunNotesWhyItWaitsAndBoundsTheWait(t *testing.T) {
	ns := newNamespace(t)
	c := outputClient(t, adminConfig(t))
	notes := &timedNotes{}
	start := time.Now()
	res, err := c.Run(t.Context(), client.RunOptions{Namespace: ns, Name: "waits", Workspace: "nowhere", Command: "true",
		Notes: notes, WaitTimeout: 4 * time.Second})
	took := time.Since(start)
	var wt *client.WaitTimeoutError
	if !errors.As(err, &wt) || res != nil {
		t.Fatalf("Run: %+v, %v; want a *client.WaitTimeoutError", res, err)
	}
	if wt.Phase != v1.PhasePending || !strings.Contains(wt.Why, "WorkspaceNotFound") || wt.Waited < 4*time.Second || took > 10*time.Second {
		t.Errorf("the wait's end: %+v after %v; want Pending, WorkspaceNotFound, 4s", wt, took)
	}
	at, ok := notes.when("is not running yet: WorkspaceNotFound")
	if !ok || at.Sub(start) > 2*time.Second {
		t.Errorf("the note came at %v (%v after the call); want within 2s: %q", at, at.Sub(start), notes.String())
	}
	var bt v1.BashTask
	if err := k8s.Get(t.Context(), ctrlclient.ObjectKey{Namespace: ns, Name: "waits"}, &bt); err != nil || !ptr.Deref(bt.Spec.CancelRequested, false) {
		t.Errorf("the task after the bound: cancelRequested %v, %v; want true", bt.Spec.CancelRequested, err)
	}
}

// TestClientWorkspaceHelpers: create, wait Ready, run in it, suspend,
// resume with the files kept, delete.
func TestClientWorkspaceHelpers(t *testing.T) {
	needWorkspaces(t)
	ns := newNamespace(t)
	c := outputClient(t, adminConfig(t))
	ctx := t.Context()
	if _, err := c.CreateWorkspace(ctx, client.WorkspaceOptions{Namespace: ns, Name: "h1", Owner: "o1", Network: "None"}); err != nil {
		t.Fatal(err)
	}
	ws, err := c.WaitWorkspaceReady(ctx, ns, "h1")
	if err != nil || ptr.Deref(ws.Status.Phase, "") != v1.WorkspaceReady {
		t.Fatalf("WaitWorkspaceReady: %v, %v", ws, err)
	}
	var notes bytes.Buffer
	run := func(command string) string {
		t.Helper()
		var out bytes.Buffer
		notes.Reset()
		res, err := c.Run(ctx, client.RunOptions{Namespace: ns, Workspace: "h1", Owner: "o1", Command: command, Stdout: &out, Notes: &notes, WaitTimeout: time.Minute})
		if err != nil || res.ExitCode != 0 {
			t.Fatalf("Run %q: %+v, %v", command, res, err)
		}
		return out.String()
	}
	run("echo kept > f")
	if ws, err = c.SuspendWorkspace(ctx, ns, "h1"); err != nil || ptr.Deref(ws.Status.Phase, "") != v1.WorkspaceSuspended {
		t.Fatalf("SuspendWorkspace: %v, %v", ws, err)
	}
	if ws, err = c.ResumeWorkspace(ctx, ns, "h1"); err != nil || ptr.Deref(ws.Status.Phase, "") != v1.WorkspaceReady {
		t.Fatalf("ResumeWorkspace: %v, %v", ws, err)
	}
	if got := run("cat f"); got != "kept\n" {
		t.Errorf("after the resume: %q, want the file written before", got)
	}
	if !strings.Contains(notes.String(), "workspace h1 was restored on node") {
		t.Errorf("the first task after the resume noted %q; want the restore", notes.String())
	}
	if err := c.DeleteWorkspace(ctx, ns, "h1"); err != nil {
		t.Fatal(err)
	}
	if _, err := c.GetWorkspace(ctx, ns, "h1"); err == nil {
		t.Error("the workspace is still there after DeleteWorkspace")
	}
}
