package agent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.uber.org/goleak"
	"gocloud.dev/blob"
	_ "gocloud.dev/blob/fileblob"
	_ "gocloud.dev/blob/s3blob"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/testing/protocmp"
	"google.golang.org/protobuf/types/known/durationpb"

	agentv1 "github.com/bashtask/bashtask-operator/api/agent/v1"
	"github.com/bashtask/bashtask-operator/executor"
	"github.com/bashtask/bashtask-operator/executor/shim"
	"github.com/bashtask/bashtask-operator/internal/rig/testshim"
	"github.com/bashtask/bashtask-operator/internal/tlsutil"
)

func TestMain(m *testing.M) {
	// The test binary is also a task shim of the tenant level; the rigs'
	// agents start the static bashtask-shim (testshim) instead.
	shim.Main()
	// Built before any agent makes this process a subreaper, whose reaper
	// would take the go command's exit status.
	if err := testshim.Prepare(); err != nil {
		fmt.Fprintln(os.Stderr, "agent tests: bashtask-shim:", err)
		os.Exit(1)
	}
	goleak.VerifyTestMain(m, goleak.Cleanup(func(code int) { testshim.Remove(); os.Exit(code) }))
}

// testCgroupParent keeps this package's task cgroups apart from those of
// the executor's tests and of other checkouts' test runs, which may run at
// the same time: an agent at the tenant level empties the pooled shims'
// cgroups under its parent when it starts.
var testCgroupParent = fmt.Sprintf("bashtask-agent-test-%d", os.Getpid())

// rig is one agent server on loopback with mTLS, and a client for it.
type rig struct {
	t      *testing.T
	srv    *Server
	addr   string
	ca     *tlsutil.CA
	dir    string
	client agentv1.ExecutorClient
	health healthpb.HealthClient
	// shutdown cancels Run's context, as the agent's SIGTERM does, and
	// returns Run's result once it returned; later calls return the same.
	shutdown func() error
}

type rigOption func(*Config)

func newRig(t *testing.T, opts ...rigOption) *rig {
	t.Helper()
	dir := t.TempDir()
	// The work root (dir) is one task UIDs pass through, as an agent's
	// is: under a TMPDIR outside /tmp the task's private /tmp does not
	// hide it, and t.TempDir's 0700 would refuse the task's UID.
	for _, d := range []string{filepath.Dir(dir), dir} {
		if err := os.Chmod(d, 0o711); err != nil {
			t.Fatal(err)
		}
	}
	ca, err := tlsutil.NewCA("test-ca", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	caFile := filepath.Join(dir, "ca.crt")
	if err := tlsutil.WriteFileAtomic(caFile, ca.CertPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	kp, err := ca.Issue(tlsutil.LeafOptions{CommonName: "agent", IPs: []net.IP{net.IPv4(127, 0, 0, 1)}, Server: true})
	if err != nil {
		t.Fatal(err)
	}
	cf, kf, err := kp.WriteFiles(dir, "server")
	if err != nil {
		t.Fatal(err)
	}
	files, err := tlsutil.NewFiles(cf, kf, caFile)
	if err != nil {
		t.Fatal(err)
	}
	cfg := Config{
		NodeName:         "node-a",
		PodName:          "agent-a",
		StateDir:         filepath.Join(dir, "state"),
		ProgressInterval: 50 * time.Millisecond,
		Executor:         executor.Config{CgroupParent: testCgroupParent, WorkDirRoot: dir, ShimPath: testshim.Path(t)},
		CertCheck:        files.Check,
		Logger:           slog.New(slog.NewTextHandler(t.Output(), nil)),
	}
	for _, o := range opts {
		o(&cfg)
	}
	srv, err := New(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	tlsCfg, err := tlsutil.ServerConfig(files, "bashtask-controller")
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer(grpc.Creds(credentials.NewTLS(tlsCfg)))
	srv.Register(g)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	runDone := make(chan error, 1)
	go func() { runDone <- srv.Run(ctx) }()
	serveDone := make(chan error, 1)
	go func() { serveDone <- g.Serve(lis) }()
	shutdown := sync.OnceValue(func() error {
		cancel()
		return <-runDone
	})
	t.Cleanup(func() {
		if err := shutdown(); err != nil {
			t.Errorf("Run: %v", err)
		}
		g.Stop()
		if err := <-serveDone; err != nil {
			t.Errorf("Serve: %v", err)
		}
		if err := srv.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	r := &rig{t: t, srv: srv, addr: lis.Addr().String(), ca: ca, dir: dir, shutdown: shutdown}
	conn := r.dial(ca, tlsutil.LeafOptions{CommonName: "bashtask-controller", Client: true})
	r.client = agentv1.NewExecutorClient(conn)
	r.health = healthpb.NewHealthClient(conn)
	return r
}

// dial connects with a client certificate issued by ca.
func (r *rig) dial(ca *tlsutil.CA, leaf tlsutil.LeafOptions) *grpc.ClientConn {
	r.t.Helper()
	kp, err := ca.Issue(leaf)
	if err != nil {
		r.t.Fatal(err)
	}
	dir := r.t.TempDir()
	cf, kf, err := kp.WriteFiles(dir, "client")
	if err != nil {
		r.t.Fatal(err)
	}
	// The client always trusts the agent's real CA: only its own
	// certificate varies.
	caFile := filepath.Join(dir, "ca.crt")
	if err := tlsutil.WriteFileAtomic(caFile, r.ca.CertPEM, 0o600); err != nil {
		r.t.Fatal(err)
	}
	files, err := tlsutil.NewFiles(cf, kf, caFile)
	if err != nil {
		r.t.Fatal(err)
	}
	cfg, err := tlsutil.ClientConfig(files, "127.0.0.1")
	if err != nil {
		r.t.Fatal(err)
	}
	conn, err := grpc.NewClient(r.addr, grpc.WithTransportCredentials(credentials.NewTLS(cfg)))
	if err != nil {
		r.t.Fatal(err)
	}
	r.t.Cleanup(func() { conn.Close() })
	return conn
}

// watch opens a Watch stream and returns its first message (the agent
// info) and a function that returns the next task event, failing the test
// after 20 s.
func (r *rig) watch() (*agentv1.AgentInfo, func() *agentv1.TaskEvent) {
	r.t.Helper()
	ctx, cancel := context.WithCancel(r.t.Context())
	r.t.Cleanup(cancel)
	stream, err := r.client.Watch(ctx, &agentv1.WatchRequest{})
	if err != nil {
		r.t.Fatal(err)
	}
	first, err := stream.Recv()
	if err != nil {
		r.t.Fatal(err)
	}
	events := make(chan *agentv1.TaskEvent, 1024)
	go func() {
		defer close(events)
		for {
			m, err := stream.Recv()
			if err != nil {
				return
			}
			if ev := m.GetTask(); ev != nil {
				events <- ev
			}
		}
	}()
	next := func() *agentv1.TaskEvent {
		r.t.Helper()
		select {
		case ev, ok := <-events:
			if !ok {
				r.t.Fatal("watch stream ended")
			}
			return ev
		case <-time.After(20 * time.Second):
			r.t.Fatal("no task event within 20 s")
		}
		return nil
	}
	return first.GetAgent(), next
}

// until returns the first event of type typ, skipping others.
func until(t *testing.T, next func() *agentv1.TaskEvent, typ agentv1.EventType) *agentv1.TaskEvent {
	t.Helper()
	for {
		if ev := next(); ev.GetType() == typ {
			return ev
		}
	}
}

func taskSpec(uid, command string) *agentv1.TaskSpec {
	return &agentv1.TaskSpec{
		Ref:       &agentv1.TaskRef{Namespace: "ns", Name: "task-" + uid, Uid: uid},
		Command:   command,
		Timeout:   durationpb.New(60 * time.Second),
		KillGrace: durationpb.New(time.Second),
	}
}

func TestRoundTrip(t *testing.T) {
	r := newRig(t)
	info, next := r.watch()
	wantInfo := &agentv1.AgentInfo{
		NodeName: "node-a", PodName: "agent-a", IncarnationId: r.srv.IncarnationID(),
		Capacity: DefaultMaxConcurrent, Running: 0,
		Readiness:        &agentv1.Readiness{Ready: true, AmbientEnv: "scrub", Shell: executor.DefaultShell, Isolation: "process", TaskNetwork: "Node"},
		ArgEnvLimitBytes: executor.CurrentArgEnvLimit(), MaxRequestBytes: agentv1.MaxRequestBytes,
	}
	if diff := cmp.Diff(wantInfo, info, protocmp.Transform(),
		protocmp.IgnoreFields(&agentv1.Readiness{}, "mechanism", "cgroup_controllers", "capabilities", "landlock_abi", "enforced_limits")); diff != "" {
		t.Errorf("agent info (-want +got):\n%s", diff)
	}

	ctx := t.Context()
	resp, err := r.client.Start(ctx, &agentv1.StartRequest{Spec: taskSpec("uid-1", `echo "hello $BASHTASK_NAMESPACE/$BASHTASK_NAME on $BASHTASK_NODE"; sleep 30`)})
	if err != nil {
		t.Fatal(err)
	}
	if resp.GetAlreadyKnown() || resp.GetStatus().GetState() != agentv1.TaskState_TASK_STATE_RUNNING {
		t.Fatalf("Start returned %v, want a running new task", resp)
	}
	if ev := next(); ev.GetType() != agentv1.EventType_EVENT_TYPE_STARTED {
		t.Fatalf("first event %v, want STARTED", ev.GetType())
	}
	progress := until(t, next, agentv1.EventType_EVENT_TYPE_PROGRESS)
	if got, want := progress.GetStatus().GetStdout().GetTail(), "hello ns/task-uid-1 on node-a\n"; got != want {
		t.Errorf("progress stdout %q, want %q", got, want)
	}
	got, err := r.client.Get(ctx, &agentv1.GetRequest{Uid: "uid-1"})
	if err != nil {
		t.Fatal(err)
	}
	if got.GetStatus().GetState() != agentv1.TaskState_TASK_STATE_RUNNING {
		t.Errorf("Get state %v, want RUNNING", got.GetStatus().GetState())
	}
	// Forget refuses a running task.
	if _, err := r.client.Forget(ctx, &agentv1.ForgetRequest{Uid: "uid-1"}); status.Code(err) != codes.FailedPrecondition {
		t.Errorf("Forget of a running task: %v, want FailedPrecondition", err)
	}

	if _, err := r.client.Cancel(ctx, &agentv1.CancelRequest{Uid: "uid-1"}); err != nil {
		t.Fatal(err)
	}
	fin := until(t, next, agentv1.EventType_EVENT_TYPE_FINISHED).GetStatus()
	wantFin := &agentv1.TaskStatus{
		Ref:   &agentv1.TaskRef{Namespace: "ns", Name: "task-uid-1", Uid: "uid-1"},
		State: agentv1.TaskState_TASK_STATE_FINISHED, Reason: "Cancelled", ExitCode: 143, Signal: "SIGTERM",
		Stdout: &agentv1.StreamStatus{Tail: "hello ns/task-uid-1 on node-a\n", TotalBytes: 30,
			Spill: &agentv1.Spill{Bytes: 30, Complete: true, UploadState: agentv1.UploadState_UPLOAD_STATE_NOT_NEEDED}},
		Stderr:        &agentv1.StreamStatus{Spill: &agentv1.Spill{Complete: true, UploadState: agentv1.UploadState_UPLOAD_STATE_NOT_NEEDED}},
		IncarnationId: r.srv.IncarnationID(),
		Isolation:     &agentv1.TaskIsolation{Level: "process", Network: "Node"},
	}
	if diff := cmp.Diff(wantFin, fin, protocmp.Transform(),
		protocmp.IgnoreFields(&agentv1.TaskStatus{}, "start_time", "completion_time", "message", "mechanism", "spec_digest", "leftover_processes"),
		protocmp.IgnoreFields(&agentv1.StreamStatus{}, "sha256")); diff != "" {
		t.Errorf("terminal status (-want +got):\n%s", diff)
	}
	// Cancel of a finished task changes nothing (C10).
	if c, err := r.client.Cancel(ctx, &agentv1.CancelRequest{Uid: "uid-1"}); err != nil || c.GetStatus().GetReason() != "Cancelled" {
		t.Errorf("second Cancel: %v, %v", c, err)
	}

	if got := metricValue(t, r.srv.metrics.Finished.WithLabelValues("Cancelled")); got != 1 {
		t.Errorf("tasks_finished_total{reason=Cancelled} = %v, want 1", got)
	}
	if got := metricValue(t, r.srv.metrics.Running); got != 0 {
		t.Errorf("running_tasks = %v, want 0", got)
	}

	f, err := r.client.Forget(ctx, &agentv1.ForgetRequest{Uid: "uid-1"})
	if err != nil || !f.GetForgotten() {
		t.Fatalf("Forget: %v, %v; want forgotten", f, err)
	}
	until(t, next, agentv1.EventType_EVENT_TYPE_FORGOTTEN)
	if _, err := r.client.Get(ctx, &agentv1.GetRequest{Uid: "uid-1"}); status.Code(err) != codes.NotFound {
		t.Errorf("Get after Forget: %v, want NotFound", err)
	}
	if l, err := r.client.List(ctx, &agentv1.ListRequest{}); err != nil || len(l.GetTasks()) != 0 {
		t.Errorf("List after Forget: %v, %v; want empty", l, err)
	}
	for _, p := range []string{"uid-1", "uid-1.json"} {
		if _, err := os.Stat(filepath.Join(r.dir, "state", "tasks", p)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s after Forget: %v, want it gone", p, err)
		}
	}
}

func TestStartIdempotent(t *testing.T) {
	r := newRig(t)
	_, next := r.watch()
	ctx := t.Context()
	count := filepath.Join(r.dir, "count")
	spec := taskSpec("uid-2", "echo x >> "+count)
	first, err := r.client.Start(ctx, &agentv1.StartRequest{Spec: spec})
	if err != nil {
		t.Fatal(err)
	}
	until(t, next, agentv1.EventType_EVENT_TYPE_FINISHED)
	again, err := r.client.Start(ctx, &agentv1.StartRequest{Spec: spec})
	if err != nil {
		t.Fatal(err)
	}
	if !again.GetAlreadyKnown() || again.GetStatus().GetReason() != "Succeeded" ||
		again.GetStatus().GetSpecDigest() != first.GetStatus().GetSpecDigest() {
		t.Errorf("repeated Start returned %v, want the known finished task", again)
	}
	b, err := os.ReadFile(count)
	if err != nil {
		t.Fatal(err)
	}
	if string(b) != "x\n" {
		t.Errorf("the command ran %d times, want once", strings.Count(string(b), "x"))
	}
	other := taskSpec("uid-2", "echo different")
	if _, err := r.client.Start(ctx, &agentv1.StartRequest{Spec: other}); status.Code(err) != codes.FailedPrecondition {
		t.Errorf("Start of a known UID with another spec: %v, want FailedPrecondition", err)
	}
}

func TestStartRejects(t *testing.T) {
	r := newRig(t, func(c *Config) { c.MaxConcurrent = 1 })
	ctx := t.Context()
	if _, err := r.client.Start(ctx, &agentv1.StartRequest{Spec: taskSpec("busy", "sleep 30")}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = r.client.Cancel(context.Background(), &agentv1.CancelRequest{Uid: "busy"}) })
	tests := map[string]struct {
		spec *agentv1.TaskSpec
		want codes.Code
	}{
		"no spec":         {spec: nil, want: codes.InvalidArgument},
		"uid with slash":  {spec: taskSpec("../x", "true"), want: codes.InvalidArgument},
		"empty namespace": {spec: &agentv1.TaskSpec{Ref: &agentv1.TaskRef{Name: "n", Uid: "u"}, Command: "true"}, want: codes.InvalidArgument},
		"over capacity":   {spec: taskSpec("second", "true"), want: codes.ResourceExhausted},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			_, err := r.client.Start(ctx, &agentv1.StartRequest{Spec: tc.spec})
			if diff := cmp.Diff(tc.want, status.Code(err)); diff != "" {
				t.Errorf("code (-want +got):\n%s\nerror: %v", diff, err)
			}
		})
	}
}

func TestStartFailedIsATerminalStatus(t *testing.T) {
	r := newRig(t)
	spec := taskSpec("uid-wd", "true")
	spec.WorkingDir = "/does/not/exist"
	resp, err := r.client.Start(t.Context(), &agentv1.StartRequest{Spec: spec})
	if err != nil {
		t.Fatal(err)
	}
	st := resp.GetStatus()
	if st.GetReason() != "StartFailed" || !strings.Contains(st.GetMessage(), "/does/not/exist") {
		t.Errorf("status %v, want StartFailed naming the directory (C27)", st)
	}
}

func TestRefusedClients(t *testing.T) {
	r := newRig(t)
	other, err := tlsutil.NewCA("other-ca", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	tests := map[string]struct {
		ca   *tlsutil.CA
		leaf tlsutil.LeafOptions
	}{
		"certificate from another CA": {ca: other, leaf: tlsutil.LeafOptions{CommonName: "bashtask-controller", Client: true}},
		"wrong identity":              {ca: r.ca, leaf: tlsutil.LeafOptions{CommonName: "intruder", Client: true}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			c := agentv1.NewExecutorClient(r.dial(tc.ca, tc.leaf))
			_, err := c.Start(t.Context(), &agentv1.StartRequest{Spec: taskSpec("refused", "touch "+filepath.Join(r.dir, "ran"))})
			if status.Code(err) != codes.Unavailable {
				t.Errorf("Start with a refused certificate: %v, want Unavailable (handshake refused)", err)
			}
		})
	}
	// Nothing reached a handler: no task, no file.
	l, err := r.client.List(t.Context(), &agentv1.ListRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if len(l.GetTasks()) != 0 {
		t.Errorf("tasks after refused clients: %v, want none", l.GetTasks())
	}
	if _, err := os.Stat(filepath.Join(r.dir, "ran")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the refused task's command ran: %v", err)
	}
}

func TestProgressOnlyWhenOutputChanged(t *testing.T) {
	r := newRig(t)
	_, next := r.watch()
	// Output changes twice, with quiet periods of many progress intervals.
	if _, err := r.client.Start(t.Context(), &agentv1.StartRequest{Spec: taskSpec("uid-p", "echo a; sleep 0.4; echo b; sleep 0.4")}); err != nil {
		t.Fatal(err)
	}
	var totals []int64
	for {
		ev := next()
		if ev.GetType() == agentv1.EventType_EVENT_TYPE_FINISHED {
			break
		}
		if ev.GetType() == agentv1.EventType_EVENT_TYPE_PROGRESS {
			totals = append(totals, ev.GetStatus().GetStdout().GetTotalBytes())
		}
	}
	// Each progress event reports new output: the totals strictly grow and
	// are among the two states the output passes through. (A heavily
	// loaded machine may merge the two changes into one event, so the
	// exact count is not asserted.)
	ok := len(totals) > 0
	for i, n := range totals {
		ok = ok && (n == 2 || n == 4) && (i == 0 || n > totals[i-1])
	}
	if !ok {
		t.Errorf("stdout totals of progress events %v, want a strictly growing subsequence of [2 4]", totals)
	}
}

func TestReadiness(t *testing.T) {
	tests := map[string]struct {
		opt        rigOption
		want       *agentv1.Readiness
		wantHealth healthpb.HealthCheckResponse_ServingStatus
		startCode  codes.Code
	}{
		"inherit is named": {
			opt:        func(c *Config) { c.Executor.AmbientEnv = executor.AmbientInherit },
			want:       &agentv1.Readiness{Ready: true, AmbientEnv: "inherit", Shell: executor.DefaultShell, Isolation: "process", TaskNetwork: "Node"},
			wantHealth: healthpb.HealthCheckResponse_SERVING,
			startCode:  codes.OK,
		},
		"missing shell (C28)": {
			opt: func(c *Config) { c.Executor.Shell = "/does/not/exist/bash" },
			want: &agentv1.Readiness{Ready: false, AmbientEnv: "scrub", Shell: "/does/not/exist/bash", Isolation: "process", TaskNetwork: "Node",
				Problems: []string{"executor: shell not found or not executable: /does/not/exist/bash: stat /does/not/exist/bash: no such file or directory"}},
			wantHealth: healthpb.HealthCheckResponse_NOT_SERVING,
			startCode:  codes.Unavailable,
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			r := newRig(t, tc.opt)
			info, _ := r.watch()
			if diff := cmp.Diff(tc.want, info.GetReadiness(), protocmp.Transform(),
				protocmp.IgnoreFields(&agentv1.Readiness{}, "mechanism", "cgroup_controllers", "capabilities", "landlock_abi", "enforced_limits")); diff != "" {
				t.Errorf("readiness (-want +got):\n%s", diff)
			}
			h, err := r.health.Check(t.Context(), &healthpb.HealthCheckRequest{Service: ServiceName})
			if err != nil {
				t.Fatal(err)
			}
			if h.GetStatus() != tc.wantHealth {
				t.Errorf("health %v, want %v", h.GetStatus(), tc.wantHealth)
			}
			_, err = r.client.Start(t.Context(), &agentv1.StartRequest{Spec: taskSpec("uid-r", "true")})
			if status.Code(err) != tc.startCode {
				t.Errorf("Start: %v, want code %v", err, tc.startCode)
			}
		})
	}
}

func TestUploadFailureThenRecovery(t *testing.T) {
	bucketDir := filepath.Join(t.TempDir(), "bucket")
	if err := os.Mkdir(bucketDir, 0o700); err != nil {
		t.Fatal(err)
	}
	r := newRig(t, func(c *Config) {
		c.BucketURL = "file://" + bucketDir + "?no_tmp_dir=true"
		c.UploadBackoffInitial = 20 * time.Millisecond
		c.UploadBackoffMax = 100 * time.Millisecond
	})
	_, next := r.watch()
	// The bucket's directory becomes a plain file: every write fails.
	if err := os.Remove(bucketDir); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bucketDir, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	spec := taskSpec("uid-u", "seq -f 'line-%04g' 1 20000")
	if _, err := r.client.Start(t.Context(), &agentv1.StartRequest{Spec: spec}); err != nil {
		t.Fatal(err)
	}
	// The terminal event is not held back by the failing upload.
	fin := until(t, next, agentv1.EventType_EVENT_TYPE_FINISHED).GetStatus()
	if sp := fin.GetStdout().GetSpill(); sp.GetUploadState() != agentv1.UploadState_UPLOAD_STATE_PENDING {
		t.Fatalf("stdout spill at finish %v, want PENDING", sp)
	}
	// Forget while the upload is pending keeps the files.
	f, err := r.client.Forget(t.Context(), &agentv1.ForgetRequest{Uid: "uid-u"})
	if err != nil || f.GetForgotten() {
		t.Fatalf("Forget with a pending upload: %v, %v; want not forgotten yet", f, err)
	}
	spill := filepath.Join(r.dir, "state", "tasks", "uid-u", "stdout")
	// Wait for some failed attempts, then repair the bucket.
	deadline := time.Now().Add(20 * time.Second)
	for {
		g, err := r.client.Get(t.Context(), &agentv1.GetRequest{Uid: "uid-u"})
		if err != nil {
			t.Fatal(err)
		}
		if g.GetStatus().GetStdout().GetSpill().GetUploadAttempts() >= 2 {
			if g.GetStatus().GetStdout().GetSpill().GetUploadError() == "" {
				t.Error("failed attempts without an upload error")
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no failed upload attempts within 20 s")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if _, err := os.Stat(spill); err != nil {
		t.Fatalf("spill file during failing uploads: %v", err)
	}
	if err := os.Remove(bucketDir); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(bucketDir, 0o700); err != nil {
		t.Fatal(err)
	}
	up := until(t, next, agentv1.EventType_EVENT_TYPE_UPLOADED).GetStatus()
	until(t, next, agentv1.EventType_EVENT_TYPE_FORGOTTEN)
	if _, err := os.Stat(spill); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("spill file after upload and Forget: %v, want it gone", err)
	}

	b, err := blob.OpenBucket(t.Context(), "file://"+bucketDir)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	rd, err := b.NewReader(t.Context(), "ns/task-uid-u/uid-u/stdout", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer rd.Close()
	data, err := io.ReadAll(rd)
	if err != nil {
		t.Fatal(err)
	}
	attrs, err := b.Attributes(t.Context(), "ns/task-uid-u/uid-u/stdout")
	if err != nil {
		t.Fatal(err)
	}
	ss := up.GetStdout()
	got := map[string]string{"len": itoa(len(data)), "sha": sha256hex(data), "meta-sha": attrs.Metadata[MetaSHA256], "meta-bytes": attrs.Metadata[MetaBytes]}
	// seq prints 9999 lines of 10 bytes and 10001 of 11: 210001 bytes.
	want := map[string]string{"len": "210001", "sha": ss.GetSha256(), "meta-sha": ss.GetSha256(), "meta-bytes": "210001"}
	if ss.GetTotalBytes() != 210001 || !ss.GetTruncated() || !strings.HasSuffix(ss.GetTail(), "line-20000\n") {
		t.Errorf("stdout status total %d truncated %v, want 210001 bytes, truncated, ending in line-20000", ss.GetTotalBytes(), ss.GetTruncated())
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("uploaded object (-want +got):\n%s", diff)
	}
}

func TestShellAppearsLater(t *testing.T) {
	shell := filepath.Join(t.TempDir(), "bash")
	r := newRig(t, func(c *Config) {
		c.Executor.Shell = shell
		c.ReadinessInterval = 50 * time.Millisecond
	})
	stream, err := r.client.Watch(t.Context(), &agentv1.WatchRequest{})
	if err != nil {
		t.Fatal(err)
	}
	first, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if first.GetAgent().GetReadiness().GetReady() {
		t.Fatal("agent ready without its shell")
	}
	bash, err := os.ReadFile(executor.DefaultShell)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(shell, bash, 0o755); err != nil {
		t.Fatal(err)
	}
	// The next AgentInfo on the stream says ready.
	for {
		m, err := stream.Recv()
		if err != nil {
			t.Fatalf("watch ended before the agent became ready: %v", err)
		}
		if info := m.GetAgent(); info != nil {
			if !info.GetReadiness().GetReady() {
				t.Fatalf("readiness changed to %v, want ready", info.GetReadiness())
			}
			break
		}
	}
	if _, err := r.client.Start(t.Context(), &agentv1.StartRequest{Spec: taskSpec("uid-late", "true")}); err != nil {
		t.Errorf("Start once the shell exists: %v", err)
	}
}

func TestWatcherDroppedWhenBehind(t *testing.T) {
	s := &Server{watchers: map[*watcher]struct{}{}}
	slow := &watcher{ch: make(chan *agentv1.WatchResponse, 1)}
	s.watchers[slow] = struct{}{}
	m := taskEvent(agentv1.EventType_EVENT_TYPE_PROGRESS, &agentv1.TaskStatus{})
	s.broadcastLocked(m)
	s.broadcastLocked(m) // buffer full: the watcher is dropped
	_, first := <-slow.ch
	_, second := <-slow.ch
	if diff := cmp.Diff([]bool{true, false, false}, []bool{first, second, len(s.watchers) > 0}); diff != "" {
		t.Errorf("[first event delivered, channel open after, still subscribed] (-want +got):\n%s", diff)
	}
}

func TestCertificateRotation(t *testing.T) {
	r := newRig(t)
	oldCA := r.ca
	newCA, err := tlsutil.NewCA("rotated-ca", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	kp, err := newCA.Issue(tlsutil.LeafOptions{CommonName: "agent", IPs: []net.IP{net.IPv4(127, 0, 0, 1)}, Server: true})
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := kp.WriteFiles(r.dir, "server"); err != nil {
		t.Fatal(err)
	}
	if err := tlsutil.WriteFileAtomic(filepath.Join(r.dir, "ca.crt"), newCA.CertPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	// A modification time surely different from the first files'.
	later := time.Now().Add(2 * time.Second)
	for _, f := range []string{"server.crt", "server.key", "ca.crt"} {
		if err := os.Chtimes(filepath.Join(r.dir, f), later, later); err != nil {
			t.Fatal(err)
		}
	}
	r.ca = newCA // clients now trust the rotated server certificate
	ctrl := tlsutil.LeafOptions{CommonName: "bashtask-controller", Client: true}
	_, errOld := agentv1.NewExecutorClient(r.dial(oldCA, ctrl)).List(t.Context(), &agentv1.ListRequest{})
	_, errNew := agentv1.NewExecutorClient(r.dial(newCA, ctrl)).List(t.Context(), &agentv1.ListRequest{})
	if diff := cmp.Diff([]codes.Code{codes.Unavailable, codes.OK}, []codes.Code{status.Code(errOld), status.Code(errNew)}); diff != "" {
		t.Errorf("codes for a client of the old CA and of the rotated CA (-want +got):\n%s\nerrors: %v, %v", diff, errOld, errNew)
	}
}

func TestStateDirUnwritable(t *testing.T) {
	r := newRig(t, func(c *Config) { c.ReadinessInterval = 50 * time.Millisecond })
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	stream, err := r.client.Watch(ctx, &agentv1.WatchRequest{})
	if err != nil {
		t.Fatal(err)
	}
	// The agent re-probes every 50 ms and sends its info whenever it
	// changes, which a failing probe's message (it names the probe file)
	// does each time: the info that shows a change is awaited, not taken
	// to be the next one.
	infoWhere := func(what string, ok func(*agentv1.Readiness) bool) *agentv1.Readiness {
		t.Helper()
		for {
			m, err := stream.Recv()
			if err != nil {
				t.Fatalf("watch ended before the agent was %s: %v", what, err)
			}
			if info := m.GetAgent(); info != nil && ok(info.GetReadiness()) {
				return info.GetReadiness()
			}
		}
	}
	ready := func(r *agentv1.Readiness) bool { return r.GetReady() }
	if !infoWhere("watched", func(*agentv1.Readiness) bool { return true }).GetReady() {
		t.Fatal("agent not ready at start")
	}
	tasks := filepath.Join(r.dir, "state", "tasks")
	if err := os.Remove(tasks); err != nil {
		t.Fatal(err)
	}
	down := infoWhere("not ready", func(r *agentv1.Readiness) bool { return !r.GetReady() })
	if err := os.Mkdir(tasks, 0o700); err != nil {
		t.Fatal(err)
	}
	infoWhere("ready again", ready)
	if p := down.GetProblems(); len(p) != 1 || !strings.Contains(p[0], "state directory not writable") {
		t.Errorf("problems without the state directory: %q, want one naming it", p)
	}
}

// Starts run outside the agent's lock; these check what the lock still
// decides: one run per UID, the capacity, and a Cancel that arrives while
// the process is being created.
func TestConcurrentStarts(t *testing.T) {
	const capacity, uids = 4, 6
	r := newRig(t, func(c *Config) { c.MaxConcurrent = capacity })
	ctx := t.Context()
	type reply struct {
		uid   string
		known bool
		code  codes.Code
	}
	replies := make(chan reply, 2*uids)
	var wg sync.WaitGroup
	for i := range uids {
		uid := "c-" + itoa(i)
		spec := taskSpec(uid, "echo x >> "+filepath.Join(r.dir, uid)+"; sleep 30")
		for range 2 {
			wg.Go(func() {
				resp, err := r.client.Start(ctx, &agentv1.StartRequest{Spec: spec})
				replies <- reply{uid, resp.GetAlreadyKnown(), status.Code(err)}
			})
		}
	}
	wg.Wait()
	close(replies)
	accepted, fresh := map[string]bool{}, map[string]int{}
	for rp := range replies {
		switch rp.code {
		case codes.OK:
			accepted[rp.uid] = true
			if !rp.known {
				fresh[rp.uid]++
			}
		case codes.ResourceExhausted:
		default:
			t.Errorf("Start %s: code %v", rp.uid, rp.code)
		}
	}
	if len(accepted) != capacity {
		t.Errorf("%d tasks accepted, want the capacity, %d", len(accepted), capacity)
	}
	for uid := range accepted {
		if fresh[uid] != 1 {
			t.Errorf("%s: %d replies started it, want 1 (the other AlreadyKnown)", uid, fresh[uid])
		}
		// Once the process exists its first line is there.
		deadline := time.Now().Add(10 * time.Second)
		for {
			b, _ := os.ReadFile(filepath.Join(r.dir, uid))
			if string(b) == "x\n" {
				break
			}
			if time.Now().After(deadline) {
				t.Errorf("%s ran %d times, want once", uid, strings.Count(string(b), "x"))
				break
			}
			time.Sleep(10 * time.Millisecond)
		}
		if _, err := r.client.Cancel(ctx, &agentv1.CancelRequest{Uid: uid}); err != nil {
			t.Error(err)
		}
	}

	// A Cancel racing the start: whether it lands before or during the
	// process's creation, the task ends Cancelled.
	_, next := r.watch()
	for i := range capacity {
		uid := "race-" + itoa(i)
		wg.Go(func() {
			for {
				_, err := r.client.Start(ctx, &agentv1.StartRequest{Spec: taskSpec(uid, "sleep 30")})
				if status.Code(err) != codes.ResourceExhausted { // the slots above free up as they end
					break
				}
				time.Sleep(5 * time.Millisecond)
			}
		})
		wg.Go(func() {
			for {
				_, err := r.client.Cancel(ctx, &agentv1.CancelRequest{Uid: uid})
				if status.Code(err) != codes.NotFound {
					return
				}
				time.Sleep(time.Millisecond)
			}
		})
	}
	wg.Wait()
	seen := map[string]string{}
	for len(seen) < capacity {
		ev := until(t, next, agentv1.EventType_EVENT_TYPE_FINISHED)
		if uid := ev.GetStatus().GetRef().GetUid(); strings.HasPrefix(uid, "race-") {
			seen[uid] = ev.GetStatus().GetReason()
		}
	}
	for uid, reason := range seen {
		if reason != "Cancelled" {
			t.Errorf("%s ended %s, want Cancelled", uid, reason)
		}
	}
}

// TestShutdownReportsStoppedTasks is what a pod deletion does to the agent:
// Run's context ends while a task runs and its output waits for upload.
// The watcher must get the task's terminal event (AgentRestarted) before
// the stream ends, every time, and Run must return promptly although the
// upload it cut short is due again at once.
func TestShutdownReportsStoppedTasks(t *testing.T) {
	t.Setenv("AWS_ACCESS_KEY_ID", "test")
	t.Setenv("AWS_SECRET_ACCESS_KEY", "test")
	for i := range 8 {
		t.Run(fmt.Sprintf("run-%d", i), func(t *testing.T) {
			r := newRig(t, func(c *Config) {
				// An S3 endpoint that accepts connections and never
				// answers: the upload that follows the task's end is in
				// flight when the shutdown cuts it short.
				c.BucketURL = "s3://outputs?region=us-east-1&use_path_style=true&endpoint=http://" + silentListener(t)
			})
			_, next := r.watch()
			spec := taskSpec("uid-s", "seq 1 100000; sleep 60")
			if _, err := r.client.Start(t.Context(), &agentv1.StartRequest{Spec: spec}); err != nil {
				t.Fatal(err)
			}
			for {
				if ev := next(); ev.GetStatus().GetStdout().GetTotalBytes() == 588895 {
					break
				}
			}
			done := make(chan error, 1)
			go func() { done <- r.shutdown() }()
			fin := until(t, next, agentv1.EventType_EVENT_TYPE_FINISHED).GetStatus()
			if got := fin.GetReason(); got != ReasonAgentRestarted {
				t.Errorf("terminal reason %q, want %q", got, ReasonAgentRestarted)
			}
			select {
			case err := <-done:
				if err != nil {
					t.Fatalf("Run: %v", err)
				}
			case <-time.After(15 * time.Second):
				t.Fatal("Run did not return within 15 s of the shutdown")
			}
		})
	}
}

// silentListener accepts TCP connections on loopback and never answers;
// it returns its address.
func silentListener(t *testing.T) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var conns []net.Conn
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := lis.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		_ = lis.Close()
		<-done
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			_ = c.Close()
		}
	})
	return lis.Addr().String()
}
