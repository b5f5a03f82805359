// Package simagent is a simulated node agent for the scale benchmark
// (docs/scaling.md): it speaks the agent protocol of api/agent/v1 (the
// Executor and Workspaces services the controller calls, over mutual TLS as
// a real agent) but runs nothing. A task finishes Succeeded after a delay
// taken from its command: `sleep N` takes N seconds, any other command
// ShortDelay. Workspaces are records only. One process can hold the
// simulated agents of a hundred nodes, which real agent processes on one
// machine cannot reach.
//
// What it leaves out, on purpose: output (no tail, no upload, no
// ReadOutput), stdin, terminals, port-forwards, snapshots, images, the
// leader fence (every fence is accepted) and persistence (a stopped agent
// forgets everything, as a lost node does).
package simagent

import (
	"cmp"
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	agentv1 "github.com/bashtask/bashtask-operator/api/agent/v1"
	"github.com/bashtask/bashtask-operator/internal/tlsutil"
)

// DefaultShortDelay is how long a task whose command is not `sleep N`
// runs on a simulated agent by default: 10 ms.
const DefaultShortDelay = 10 * time.Millisecond

// Options configure one simulated agent.
type Options struct {
	// Node is the Node name the agent reports.
	Node string
	// Listen is the gRPC address, such as 127.0.0.2:9443.
	Listen string
	// TLS is the agent's serving key pair and the CA of its clients.
	TLS *tlsutil.Files
	// ClientIdentity is the common name the controller's certificate must
	// carry (localcluster.ControllerIdentity).
	ClientIdentity string
	// Capacity is the most tasks running at once; 0 means 16, the real
	// agent's --max-concurrent-tasks default.
	Capacity int
	// ShortDelay is the run time of a task whose command is not
	// `sleep N`; 0 means DefaultShortDelay.
	ShortDelay time.Duration
	// OnStart, when set, is called for every Start that starts a task
	// (not for a UID already known), after it was admitted.
	OnStart func(node string)
}

// Agent is one running simulated agent.
type Agent struct {
	agentv1.UnimplementedExecutorServer
	agentv1.UnimplementedWorkspacesServer

	o           Options
	incarnation string
	srv         *grpc.Server
	lis         net.Listener
	starts      atomic.Int64

	mu         sync.Mutex
	tasks      map[string]*agentv1.TaskStatus
	running    int
	workspaces map[string]*agentv1.WorkspaceStatus
	watchers   map[chan *agentv1.WatchResponse]struct{}
	timers     map[string]*time.Timer
	stopped    bool
}

// Start listens on o.Listen and serves until Stop.
func Start(o Options) (*Agent, error) {
	if o.Node == "" || o.Listen == "" || o.TLS == nil || o.ClientIdentity == "" {
		return nil, fmt.Errorf("simagent: Node, Listen, TLS and ClientIdentity are required")
	}
	o.Capacity = cmp.Or(o.Capacity, 16)
	o.ShortDelay = cmp.Or(o.ShortDelay, DefaultShortDelay)
	tlsCfg, err := tlsutil.ServerConfig(o.TLS, o.ClientIdentity)
	if err != nil {
		return nil, fmt.Errorf("simagent %s: %w", o.Node, err)
	}
	lis, err := net.Listen("tcp", o.Listen)
	if err != nil {
		return nil, fmt.Errorf("simagent %s: %w", o.Node, err)
	}
	id := make([]byte, 8)
	_, _ = rand.Read(id)
	a := &Agent{o: o, incarnation: hex.EncodeToString(id), lis: lis,
		srv:   newGRPCServer(tlsCfg),
		tasks: map[string]*agentv1.TaskStatus{}, workspaces: map[string]*agentv1.WorkspaceStatus{},
		watchers: map[chan *agentv1.WatchResponse]struct{}{}, timers: map[string]*time.Timer{}}
	agentv1.RegisterExecutorServer(a.srv, a)
	agentv1.RegisterWorkspacesServer(a.srv, a)
	go func() { _ = a.srv.Serve(lis) }()
	return a, nil
}

// newGRPCServer is the real agent's server settings (cmd/bashtask-agent):
// mutual TLS, the protocol's request size limit, and keepalives that take
// the controller's pings (every 10 s, with or without a stream) instead
// of ending its connection with too_many_pings.
func newGRPCServer(tlsCfg *tls.Config) *grpc.Server {
	return grpc.NewServer(
		grpc.Creds(credentials.NewTLS(tlsCfg)),
		grpc.MaxRecvMsgSize(agentv1.MaxRequestBytes),
		grpc.KeepaliveParams(keepalive.ServerParameters{Time: 30 * time.Second, Timeout: 10 * time.Second}),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 10 * time.Second, PermitWithoutStream: true}),
	)
}

// Close stops the agent at once, as a lost node: its streams and
// connections end and its tasks and workspaces are forgotten.
func (a *Agent) Close() error {
	a.mu.Lock()
	a.stopped = true
	for _, t := range a.timers {
		t.Stop()
	}
	a.mu.Unlock()
	a.srv.Stop()
	return nil
}

// Starts is the number of tasks this agent started.
func (a *Agent) Starts() int64 { return a.starts.Load() }

// Workspaces is the number of workspaces the agent holds.
func (a *Agent) Workspaces() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.workspaces)
}

// runTime is how long a task with this command runs: N seconds for
// `sleep N`, else the short delay.
func (a *Agent) runTime(command string) time.Duration {
	f := strings.Fields(command)
	if len(f) == 2 && f[0] == "sleep" {
		if s, err := strconv.ParseFloat(f[1], 64); err == nil && s >= 0 {
			return time.Duration(s * float64(time.Second))
		}
	}
	return a.o.ShortDelay
}

func (a *Agent) infoLocked() *agentv1.AgentInfo {
	return &agentv1.AgentInfo{
		NodeName: a.o.Node, PodName: "simagent-" + a.o.Node, IncarnationId: a.incarnation,
		Capacity: int32(a.o.Capacity), Running: int32(a.running),
		Readiness: &agentv1.Readiness{
			Ready: true, AmbientEnv: "none", Mechanism: "processGroup", Shell: "/bin/bash",
			Isolation: "tenant", TaskNetwork: "Node", AllowedNetworks: []string{"Node", "None"},
			Capabilities: []string{"namespaces", "workspaces"},
		},
		ArgEnvLimitBytes: 2 << 20, MaxRequestBytes: agentv1.MaxRequestBytes,
	}
}

// broadcastLocked queues m for every watcher; a watcher that fell behind
// is dropped, as the real agent drops it.
func (a *Agent) broadcastLocked(t agentv1.EventType, st *agentv1.TaskStatus) {
	m := &agentv1.WatchResponse{Event: &agentv1.WatchResponse_Task{Task: &agentv1.TaskEvent{Type: t, Status: proto.CloneOf(st)}}}
	for ch := range a.watchers {
		select {
		case ch <- m:
		default:
			close(ch)
			delete(a.watchers, ch)
		}
	}
}

// Watch sends the agent's info, one CURRENT event per task, then events.
func (a *Agent) Watch(_ *agentv1.WatchRequest, stream agentv1.Executor_WatchServer) error {
	ch := make(chan *agentv1.WatchResponse, 4096)
	a.mu.Lock()
	first := []*agentv1.WatchResponse{{Event: &agentv1.WatchResponse_Agent{Agent: a.infoLocked()}}}
	for _, uid := range sortedKeys(a.tasks) {
		first = append(first, &agentv1.WatchResponse{Event: &agentv1.WatchResponse_Task{Task: &agentv1.TaskEvent{
			Type: agentv1.EventType_EVENT_TYPE_CURRENT, Status: proto.CloneOf(a.tasks[uid])}}})
	}
	a.watchers[ch] = struct{}{}
	a.mu.Unlock()
	defer func() {
		a.mu.Lock()
		delete(a.watchers, ch)
		a.mu.Unlock()
	}()
	for _, m := range first {
		if err := stream.Send(m); err != nil {
			return err
		}
	}
	for {
		select {
		case <-stream.Context().Done():
			return nil
		case m, ok := <-ch:
			if !ok {
				return status.Error(codes.ResourceExhausted, "watcher fell behind; watch again")
			}
			if err := stream.Send(m); err != nil {
				return err
			}
		}
	}
}

// Start admits a task and finishes it after its run time.
func (a *Agent) Start(_ context.Context, req *agentv1.StartRequest) (*agentv1.StartResponse, error) {
	spec := req.GetSpec()
	uid := spec.GetRef().GetUid()
	if uid == "" {
		return nil, status.Error(codes.InvalidArgument, "spec.ref.uid is empty")
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if st, ok := a.tasks[uid]; ok {
		return &agentv1.StartResponse{Status: proto.CloneOf(st), AlreadyKnown: true}, nil
	}
	if a.running >= a.o.Capacity {
		return nil, status.Errorf(codes.ResourceExhausted, "node %s runs %d tasks, its capacity", a.o.Node, a.running)
	}
	now := timestamppb.Now()
	st := &agentv1.TaskStatus{Ref: proto.CloneOf(spec.GetRef()), State: agentv1.TaskState_TASK_STATE_RUNNING,
		StartTime: now, IncarnationId: a.incarnation, Mechanism: "processGroup",
		Stdout: &agentv1.StreamStatus{}, Stderr: &agentv1.StreamStatus{}}
	a.tasks[uid] = st
	a.running++
	a.starts.Add(1)
	a.markWorkspaceLocked(spec.GetWorkspace(), spec.GetRef(), 1)
	a.broadcastLocked(agentv1.EventType_EVENT_TYPE_STARTED, st)
	ws := spec.GetWorkspace()
	a.timers[uid] = time.AfterFunc(a.runTime(spec.GetCommand()), func() { a.finish(uid, ws) })
	if a.o.OnStart != nil {
		a.o.OnStart(a.o.Node)
	}
	return &agentv1.StartResponse{Status: proto.CloneOf(st)}, nil
}

// finish ends a running task Succeeded with exit code 0.
func (a *Agent) finish(uid string, ws *agentv1.WorkspaceRef) {
	a.mu.Lock()
	defer a.mu.Unlock()
	st, ok := a.tasks[uid]
	delete(a.timers, uid)
	if !ok || a.stopped || st.GetState() == agentv1.TaskState_TASK_STATE_FINISHED {
		return
	}
	a.endLocked(st, "Succeeded", 0)
	a.markWorkspaceLocked(ws, st.GetRef(), -1)
	a.broadcastLocked(agentv1.EventType_EVENT_TYPE_FINISHED, st)
}

func (a *Agent) endLocked(st *agentv1.TaskStatus, reason string, code int32) {
	st.State = agentv1.TaskState_TASK_STATE_FINISHED
	st.Reason, st.ExitCode = reason, code
	st.CompletionTime = timestamppb.Now()
	a.running--
}

// markWorkspaceLocked counts a task of ws in (delta 1) or out (-1).
func (a *Agent) markWorkspaceLocked(ws *agentv1.WorkspaceRef, task *agentv1.TaskRef, delta int32) {
	if ws == nil {
		return
	}
	w, ok := a.workspaces[ws.GetUid()]
	if !ok {
		return
	}
	w.RunningTasks = max(w.GetRunningTasks()+delta, 0)
	if delta < 0 {
		w.LastTaskEnd = timestamppb.Now()
		w.LastTaskName, w.LastTaskUid = task.GetName(), task.GetUid()
	}
}

// Cancel ends a running task Cancelled at once.
func (a *Agent) Cancel(_ context.Context, req *agentv1.CancelRequest) (*agentv1.CancelResponse, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	st, ok := a.tasks[req.GetUid()]
	if !ok {
		return nil, status.Errorf(codes.NotFound, "task %s is unknown", req.GetUid())
	}
	if st.GetState() == agentv1.TaskState_TASK_STATE_RUNNING {
		if t := a.timers[req.GetUid()]; t != nil {
			t.Stop()
			delete(a.timers, req.GetUid())
		}
		a.endLocked(st, "Cancelled", -1)
		a.broadcastLocked(agentv1.EventType_EVENT_TYPE_FINISHED, st)
	}
	return &agentv1.CancelResponse{Status: proto.CloneOf(st)}, nil
}

// Get returns one task's status.
func (a *Agent) Get(_ context.Context, req *agentv1.GetRequest) (*agentv1.GetResponse, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	st, ok := a.tasks[req.GetUid()]
	if !ok {
		return nil, status.Errorf(codes.NotFound, "task %s is unknown", req.GetUid())
	}
	return &agentv1.GetResponse{Status: proto.CloneOf(st)}, nil
}

// List returns every task in one page: the simulated agent holds few at a
// time, since the controller forgets finished ones.
func (a *Agent) List(context.Context, *agentv1.ListRequest) (*agentv1.ListResponse, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	resp := &agentv1.ListResponse{}
	for _, uid := range sortedKeys(a.tasks) {
		resp.Tasks = append(resp.Tasks, proto.CloneOf(a.tasks[uid]))
	}
	return resp, nil
}

// Forget drops a finished task.
func (a *Agent) Forget(_ context.Context, req *agentv1.ForgetRequest) (*agentv1.ForgetResponse, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	st, ok := a.tasks[req.GetUid()]
	if !ok {
		return &agentv1.ForgetResponse{Forgotten: true}, nil
	}
	if st.GetState() == agentv1.TaskState_TASK_STATE_RUNNING {
		return nil, status.Errorf(codes.FailedPrecondition, "task %s is running", req.GetUid())
	}
	delete(a.tasks, req.GetUid())
	a.broadcastLocked(agentv1.EventType_EVENT_TYPE_FORGOTTEN, st)
	return &agentv1.ForgetResponse{Forgotten: true}, nil
}

// EnsureWorkspace records a workspace, or returns the one recorded.
func (a *Agent) EnsureWorkspace(_ context.Context, req *agentv1.EnsureWorkspaceRequest) (*agentv1.EnsureWorkspaceResponse, error) {
	ref := req.GetSpec().GetRef()
	if ref.GetUid() == "" {
		return nil, status.Error(codes.InvalidArgument, "spec.ref.uid is empty")
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if w, ok := a.workspaces[ref.GetUid()]; ok {
		w.Ref.Epoch, w.Epoch = ref.GetEpoch(), ref.GetEpoch()
		return &agentv1.EnsureWorkspaceResponse{Status: proto.CloneOf(w)}, nil
	}
	w := &agentv1.WorkspaceStatus{Ref: proto.CloneOf(ref), Epoch: ref.GetEpoch(), RunAsUser: 3000000,
		Path: "/simulated/" + ref.GetUid(), WorkingDir: "/simulated/" + ref.GetUid(), Network: "Node", CreateTime: timestamppb.Now()}
	a.workspaces[ref.GetUid()] = w
	return &agentv1.EnsureWorkspaceResponse{Status: proto.CloneOf(w), Created: true}, nil
}

// GetWorkspace returns one workspace's status.
func (a *Agent) GetWorkspace(_ context.Context, req *agentv1.GetWorkspaceRequest) (*agentv1.GetWorkspaceResponse, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	w, ok := a.workspaces[req.GetUid()]
	if !ok {
		return nil, status.Errorf(codes.NotFound, "workspace %s is unknown", req.GetUid())
	}
	return &agentv1.GetWorkspaceResponse{Status: proto.CloneOf(w)}, nil
}

// ListWorkspaces returns every workspace.
func (a *Agent) ListWorkspaces(context.Context, *agentv1.ListWorkspacesRequest) (*agentv1.ListWorkspacesResponse, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	resp := &agentv1.ListWorkspacesResponse{}
	for _, uid := range sortedKeys(a.workspaces) {
		resp.Workspaces = append(resp.Workspaces, proto.CloneOf(a.workspaces[uid]))
	}
	return resp, nil
}

// DeleteWorkspace drops a workspace; deleting an unknown one succeeds.
func (a *Agent) DeleteWorkspace(_ context.Context, req *agentv1.DeleteWorkspaceRequest) (*agentv1.DeleteWorkspaceResponse, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	delete(a.workspaces, req.GetUid())
	return &agentv1.DeleteWorkspaceResponse{}, nil
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}
