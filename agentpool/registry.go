package agentpool

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"

	agentv1 "github.com/bashtask/bashtask-operator/api/agent/v1"
	bashtaskv1alpha1 "github.com/bashtask/bashtask-operator/api/v1alpha1"
)

// ErrAgentUnavailable is returned by [AgentRegistry] calls for a node that
// has no connected agent.
var ErrAgentUnavailable = errors.New("no connected agent on the node")

// ErrTaskUnknown is returned by [AgentRegistry.GetTask] and
// [AgentRegistry.CancelTask] when the agent does not know the task's UID.
var ErrTaskUnknown = errors.New("agent does not know the task")

// AgentState is what the registry knows of the agent of one node.
type AgentState struct {
	// Node is the node name from the agent's EndpointSlice entry.
	Node string
	// Pod is the agent's pod name, as the agent reports it.
	Pod string
	// Incarnation is the id the agent process generated at its start.
	Incarnation string
	// Capacity is the agent's maximum number of concurrent tasks.
	Capacity int
	// Running is the number of tasks the agent runs, as last reported,
	// plus tasks started since.
	Running int
	// Ready is true when the agent's Watch stream works and the agent
	// reports itself ready (shell present, state dir writable, certificates
	// usable).
	Ready bool
	// Connected is true while the agent's Watch stream works.
	Connected bool
	// Draining is true when the agent was asked to stop (SIGTERM: a
	// DaemonSet rollout, a node shutdown) and moves its workspaces off
	// before it exits (Readiness.draining); such an agent is not Ready.
	Draining bool
	// UnreachableFor is how long, on the controller's monotonic clock, the
	// agent has been without a working stream; zero while connected.
	UnreachableFor time.Duration
	// AmbientEnv is the agent's --ambient-env mode.
	AmbientEnv string
	// Isolation is the agent's --isolation level ("process" or "tenant").
	Isolation string
	// TaskNetwork is the agent's default network for tasks ("Node",
	// "None" or "Egress").
	TaskNetwork string
	// AllowedNetworks are the values of spec.network the agent runs (its
	// --allowed-networks); empty from an agent that does not report them.
	AllowedNetworks []string
	// Capabilities are what the agent detected its node allows
	// ("namespaces", "netns", "egress", "landlock", "seccomp", "cgroup",
	// "pids").
	Capabilities []string
	// Shell is the absolute path of the agent's shell.
	Shell string
	// ArgEnvLimit is the most bytes the agent's execve accepts for a
	// task's arguments and environment together (its ARG_MAX); 0 when
	// the agent does not report it.
	ArgEnvLimit int64
	// MaxRequestBytes is the largest request message the agent accepts;
	// 0 when the agent does not report it.
	MaxRequestBytes int64
	// DiskCap is the largest spec.resources.ephemeralStorage the agent
	// accepts, in bytes (its --task-disk-cap); 0 when it has no disk quota
	// or does not report it.
	DiskCap int64
	// EnforcedLimits names the limits the agent's node enforces for its
	// tasks ("memory", "cpu", "pids", "ephemeral-storage";
	// Readiness.enforced_limits); empty from an agent that enforces none
	// or does not report them.
	EnforcedLimits []string
}

// HeldTask names a task an agent holds (running, or finished and not yet
// forgotten).
type HeldTask struct {
	// Node is the node of the agent that holds the task.
	Node string
	// Task is the BashTask's namespace and name, as the agent has them.
	Task types.NamespacedName
	// UID is the BashTask's UID, the agent's key for the task.
	UID types.UID
}

// AgentRegistryOptions configures an [AgentRegistry].
type AgentRegistryOptions struct {
	// Reader lists the agents' EndpointSlices, normally the manager's cache.
	Reader client.Reader
	// ServiceNamespace and ServiceName name the agents' headless Service;
	// its EndpointSlices carry the label kubernetes.io/service-name.
	ServiceNamespace, ServiceName string
	// PortName selects the EndpointSlice port; empty takes the first port.
	PortName string
	// TLS is the client configuration (certificate, CA, server name) used
	// to dial every agent. Required: there is no plaintext mode.
	TLS *tls.Config
	// Clock measures unreachability; it must be monotonic (a real clock, or
	// a fake one in tests).
	Clock clock.PassiveClock
	// Notify receives one event per task event an agent reports, naming the
	// task, so that it is reconciled.
	Notify chan<- event.TypedGenericEvent[*bashtaskv1alpha1.BashTask]
	// AgentChanged, when set, receives the agent's Node (only its name
	// set) each time an agent repeats its info on its Watch stream (its
	// readiness changed), when a stream that had begun ends (the agent
	// became unreachable), and when a stream begins with the agent
	// draining or after an earlier one (the agent is back, maybe as a new
	// incarnation without its workspaces), so that the workspaces of that
	// node are reconciled: a draining agent's workspaces move at once, and
	// a lost one's count toward --agent-lost-after, not at their next
	// refresh.
	AgentChanged chan<- event.TypedGenericEvent[*corev1.Node]
	// Held, when set, receives each task an agent lists at the start of a
	// Watch stream (its CURRENT events), so that tasks whose BashTask is
	// gone are found on every (re)connect; see OrphanCollector.
	Held chan<- HeldTask
	// Fence, when set (leader election on), supplies the fence sent with
	// Start, Cancel and Watch; Start, Cancel, Forget and Watch are not
	// made while it reports that this controller is not sure it leads.
	Fence Fencer
	// WorkspaceLease is the window of each agent's lease on its workspaces
	// that the registry's Watch grants (WatchRequest.workspace_lease_ms):
	// a workspace task on an agent no controller watches ends on its own
	// within it. Set it below the reconcilers' AgentLostAfter (the
	// controller uses half of it), so that a workspace's tasks on a lost
	// node have ended before the workspace is restored elsewhere; 0
	// grants none and leaves workspace tasks unfenced.
	WorkspaceLease time.Duration
	// Log is the registry's logger.
	Log logr.Logger
}

// AgentRegistry keeps one mTLS gRPC connection and one Watch stream per
// ready agent endpoint, keyed by node name, and relays task events as
// reconcile triggers. It implements manager.Runnable.
type AgentRegistry struct {
	// StreamEnds counts Watch streams that ended other than by the
	// registry closing them, by gRPC code (bashtask_agent_watch_ends_total):
	// "Unavailable" for an agent that went away, "ResourceExhausted" for
	// a message over a size limit or a watcher that fell behind,
	// "FailedPrecondition" for a stream refused by leader fencing. Add it
	// to a Prometheus registry to export it.
	StreamEnds *prometheus.CounterVec

	opts    AgentRegistryOptions
	started time.Time

	mu     sync.Mutex
	agents map[string]*agentConn // by node name
	resync chan struct{}
}

// NewAgentRegistry returns a registry; call Start (through the manager) to
// begin following the EndpointSlices.
func NewAgentRegistry(opts AgentRegistryOptions) (*AgentRegistry, error) {
	if opts.TLS == nil {
		return nil, errors.New("agent registry: a TLS client configuration is required")
	}
	if opts.Reader == nil || opts.ServiceName == "" || opts.ServiceNamespace == "" {
		return nil, errors.New("agent registry: the EndpointSlice reader and the agents' Service name and namespace are required")
	}
	if opts.Clock == nil {
		opts.Clock = clock.RealClock{}
	}
	return &AgentRegistry{
		StreamEnds: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "bashtask_agent_watch_ends_total", Help: "Agent Watch streams that ended, by gRPC code.",
		}, []string{"code"}),
		opts:    opts,
		started: opts.Clock.Now(),
		agents:  map[string]*agentConn{},
		resync:  make(chan struct{}, 1),
	}, nil
}

// SetupWithManager runs the registry with the manager (on the leader only)
// and re-reads the EndpointSlices whenever the cache sees one change.
func (r *AgentRegistry) SetupWithManager(mgr ctrl.Manager) error {
	inf, err := mgr.GetCache().GetInformer(context.Background(), &discoveryv1.EndpointSlice{})
	if err != nil {
		return fmt.Errorf("watching EndpointSlices: %w", err)
	}
	trigger := func(any) { r.Trigger() }
	if _, err := inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc:    trigger,
		UpdateFunc: func(_, n any) { trigger(n) },
		DeleteFunc: trigger,
	}); err != nil {
		return fmt.Errorf("watching EndpointSlices: %w", err)
	}
	return mgr.Add(r)
}

// Trigger asks the registry to re-read the EndpointSlices soon. Calls
// coalesce.
func (r *AgentRegistry) Trigger() {
	select {
	case r.resync <- struct{}{}:
	default:
	}
}

// Start follows the EndpointSlices until ctx ends, then closes every
// connection. It re-reads them on Trigger and every few seconds, so a
// missed notification only delays a change.
func (r *AgentRegistry) Start(ctx context.Context) error {
	tick := time.NewTicker(5 * time.Second)
	defer tick.Stop()
	defer r.closeAll()
	for {
		if err := r.sync(ctx); err != nil {
			r.opts.Log.Error(err, "Reading the agents' EndpointSlices")
		}
		select {
		case <-ctx.Done():
			return nil
		case <-r.resync:
		case <-tick.C:
		}
	}
}

// sync reconciles the set of connections with the ready endpoints.
func (r *AgentRegistry) sync(ctx context.Context) error {
	want, err := agentAddresses(ctx, r.opts.Reader, r.opts.ServiceNamespace, r.opts.ServiceName, r.opts.PortName)
	if err != nil {
		return err
	}

	r.mu.Lock()
	defer r.mu.Unlock()
	for node, addr := range want {
		a := r.agents[node]
		if a != nil && a.addr == addr && !a.closed() {
			continue
		}
		if a != nil {
			a.close()
		}
		na, err := r.dial(ctx, node, addr)
		if err != nil {
			r.opts.Log.Error(err, "Dialing agent", "node", node, "address", addr)
			continue
		}
		if a != nil {
			// Unreachability is measured across address changes: a new
			// pod on the node does not reset the clock until it answers.
			na.unreachableSince = a.unreachableSinceLocked(r.opts.Clock.Now())
		}
		r.agents[node] = na
	}
	for node, a := range r.agents {
		if _, ok := want[node]; !ok && !a.closed() {
			// Gone from the endpoints: keep the entry so that its
			// unreachable time keeps counting towards AgentLost.
			a.close()
		}
	}
	return nil
}

// agentAddresses reads the agent endpoints of the Service's
// EndpointSlices: node name to host:port (endpointAddresses).
func agentAddresses(ctx context.Context, reader client.Reader, namespace, service, portName string) (map[string]string, error) {
	var slices discoveryv1.EndpointSliceList
	if err := reader.List(ctx, &slices, client.InNamespace(namespace),
		client.MatchingLabels{discoveryv1.LabelServiceName: service}); err != nil {
		return nil, fmt.Errorf("listing EndpointSlices of service %s/%s: %w", namespace, service, err)
	}
	return endpointAddresses(slices.Items, portName), nil
}

// endpointAddresses picks one endpoint per node: a ready one (or one of
// unknown readiness), else a terminating one. A terminating endpoint is
// never ready (the EndpointSlice API's rule, whatever its readiness
// probe says), yet its agent serves until it exits, and a draining agent
// needs the controller until then to move its workspaces
// (docs/workspaces.md, "Agent shutdown"). An endpoint that is neither,
// an agent not ready yet, is left out.
func endpointAddresses(items []discoveryv1.EndpointSlice, portName string) map[string]string {
	want := map[string]string{}        // node -> host:port
	terminating := map[string]string{} // node -> host:port
	for i := range items {
		s := &items[i]
		port := pickPort(s, portName)
		if port == 0 {
			continue
		}
		for _, ep := range s.Endpoints {
			if ep.NodeName == nil || *ep.NodeName == "" || len(ep.Addresses) == 0 {
				continue
			}
			addr := net.JoinHostPort(ep.Addresses[0], strconv.Itoa(int(port)))
			switch {
			case ep.Conditions.Ready == nil || *ep.Conditions.Ready:
				want[*ep.NodeName] = addr
			case ep.Conditions.Terminating != nil && *ep.Conditions.Terminating:
				terminating[*ep.NodeName] = addr
			}
		}
	}
	for node, addr := range terminating {
		if _, ok := want[node]; !ok {
			want[node] = addr
		}
	}
	return want
}

func pickPort(s *discoveryv1.EndpointSlice, portName string) int32 {
	for _, p := range s.Ports {
		if p.Port == nil {
			continue
		}
		if portName == "" || (p.Name != nil && *p.Name == portName) {
			return *p.Port
		}
	}
	return 0
}

func (r *AgentRegistry) dial(ctx context.Context, node, addr string) (*agentConn, error) {
	cc, err := dial(addr, r.opts.TLS)
	if err != nil {
		return nil, fmt.Errorf("creating a gRPC client for %s: %w", addr, err)
	}
	wctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	a := &agentConn{
		node:             node,
		addr:             addr,
		cc:               cc,
		client:           agentv1.NewExecutorClient(cc),
		cancel:           cancel,
		done:             make(chan struct{}),
		running:          map[string]bool{},
		latest:           map[string]*agentv1.TaskStatus{},
		unreachableSince: r.opts.Clock.Now(),
	}
	go a.watchLoop(wctx, r)
	return a, nil
}

func (r *AgentRegistry) closeAll() {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, a := range r.agents {
		a.close()
	}
}

// Agents returns the state of every agent the registry knows, sorted by
// nothing in particular.
func (r *AgentRegistry) Agents() []AgentState {
	r.mu.Lock()
	defer r.mu.Unlock()
	now := r.opts.Clock.Now()
	out := make([]AgentState, 0, len(r.agents))
	for _, a := range r.agents {
		out = append(out, a.state(now))
	}
	return out
}

// Agent returns the state of the node's agent. For a node the registry has
// never seen, the agent counts as unreachable since the registry started:
// after a controller restart, an agent that never comes back is lost
// --agent-lost-after later, not never.
func (r *AgentRegistry) Agent(node string) AgentState {
	r.mu.Lock()
	defer r.mu.Unlock()
	now := r.opts.Clock.Now()
	if a := r.agents[node]; a != nil {
		return a.state(now)
	}
	return AgentState{Node: node, UnreachableFor: now.Sub(r.started)}
}

func (r *AgentRegistry) conn(node string) (*agentConn, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	a := r.agents[node]
	if a == nil || a.closed() {
		return nil, fmt.Errorf("node %q: %w", node, ErrAgentUnavailable)
	}
	return a, nil
}

// StartTask sends the task to the node's agent. The agent makes Start
// idempotent on the task UID, so a repeat after a lost reply starts
// nothing twice. A task whose image is not on the node yet returns an
// *ImagePullingError, one whose image cannot be pulled an
// *ImageFailedError; both started nothing.
func (r *AgentRegistry) StartTask(ctx context.Context, node string, spec *agentv1.TaskSpec) (*agentv1.TaskStatus, error) {
	a, err := r.conn(node)
	if err != nil {
		return nil, err
	}
	ctx, cancel, fence, err := fenceFor(ctx, r.opts.Fence, "Start")
	if err != nil {
		return nil, fmt.Errorf("starting task on node %q: %w", node, err)
	}
	defer cancel()
	resp, err := a.client.Start(ctx, &agentv1.StartRequest{Spec: spec, Fence: fence})
	noteFenced(r.opts.Fence, err)
	if err != nil {
		return nil, fmt.Errorf("starting task on node %q: %w", node, err)
	}
	if ip := resp.GetImagePull(); ip != nil {
		return nil, &ImagePullingError{Node: node, Status: ip}
	}
	if f := resp.GetImageFailure(); f != nil {
		return nil, &ImageFailedError{Node: node, Failure: f}
	}
	a.observe(resp.GetStatus(), false, true)
	return resp.GetStatus(), nil
}

// ImagePullingError is StartTask's answer when the agent started nothing
// because the task's image is not on the node yet (StartResponse.image_pull):
// the agent pulls it, and a later StartTask with the same spec starts the
// task once it is there.
type ImagePullingError struct {
	// Node is the node whose agent pulls.
	Node string
	// Status is the pull's progress.
	Status *agentv1.ImageStatus
}

func (e *ImagePullingError) Error() string {
	return fmt.Sprintf("node %q is pulling image %s (%d of %d bytes)", e.Node, e.Status.GetReference(), e.Status.GetDownloadedBytes(), e.Status.GetTotalBytes())
}

// ImageFailedError is StartTask's answer when the task's image cannot be
// pulled on the node (StartResponse.image_failure): nothing was started,
// and the task ends with Failure.reason.
type ImageFailedError struct {
	// Node is the node whose agent failed to pull.
	Node string
	// Failure is the agent's reason and message.
	Failure *agentv1.ImageFailure
}

func (e *ImageFailedError) Error() string {
	return fmt.Sprintf("node %q cannot pull the task's image: %s: %s", e.Node, e.Failure.GetReason(), e.Failure.GetMessage())
}

// GetTask returns the task's current status from the node's agent, or an error
// wrapping ErrTaskUnknown.
func (r *AgentRegistry) GetTask(ctx context.Context, node, uid string) (*agentv1.TaskStatus, error) {
	a, err := r.conn(node)
	if err != nil {
		return nil, err
	}
	resp, err := a.client.Get(ctx, &agentv1.GetRequest{Uid: uid})
	if status.Code(err) == codes.NotFound {
		return nil, fmt.Errorf("task %s on node %q: %w", uid, node, ErrTaskUnknown)
	}
	if err != nil {
		return nil, fmt.Errorf("getting task %s from node %q: %w", uid, node, err)
	}
	return resp.GetStatus(), nil
}

// CancelTask asks the node's agent to stop the task (SIGTERM, grace, SIGKILL).
// It is idempotent; an unknown UID returns an error wrapping ErrTaskUnknown.
func (r *AgentRegistry) CancelTask(ctx context.Context, node, uid string) (*agentv1.TaskStatus, error) {
	a, err := r.conn(node)
	if err != nil {
		return nil, err
	}
	ctx, cancel, fence, err := fenceFor(ctx, r.opts.Fence, "Cancel")
	if err != nil {
		return nil, fmt.Errorf("cancelling task %s on node %q: %w", uid, node, err)
	}
	defer cancel()
	resp, err := a.client.Cancel(ctx, &agentv1.CancelRequest{Uid: uid, Fence: fence})
	noteFenced(r.opts.Fence, err)
	if status.Code(err) == codes.NotFound {
		return nil, fmt.Errorf("task %s on node %q: %w", uid, node, ErrTaskUnknown)
	}
	if err != nil {
		return nil, fmt.Errorf("cancelling task %s on node %q: %w", uid, node, err)
	}
	return resp.GetStatus(), nil
}

// Holds reports whether the node's agent, as last reported on its Watch
// stream, still keeps the task (finished tasks stay until forgotten and
// uploaded). It is false for an unreachable agent.
func (r *AgentRegistry) Holds(node, uid string) bool {
	a, err := r.conn(node)
	if err != nil {
		return false
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	_, held := a.latest[uid]
	return a.connected && held
}

// Latest returns the newest status of a task that the node's agent
// reported on its Watch stream or in a reply, saving a Get round trip. ok is
// false when the agent is not connected or has not reported the task.
func (r *AgentRegistry) Latest(node, uid string) (ts *agentv1.TaskStatus, ok bool) {
	a, err := r.conn(node)
	if err != nil {
		return nil, false
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if !a.connected {
		return nil, false
	}
	ts, ok = a.latest[uid]
	return ts, ok
}

// ForgetTask tells the node's agent that the terminal status is recorded. It
// returns true when the agent dropped the task now, false when it will once
// its uploads finish.
func (r *AgentRegistry) ForgetTask(ctx context.Context, node, uid string) (bool, error) {
	a, err := r.conn(node)
	if err != nil {
		return false, err
	}
	ctx, cancel, _, err := fenceFor(ctx, r.opts.Fence, "Forget")
	if err != nil {
		return false, fmt.Errorf("forgetting task %s on node %q: %w", uid, node, err)
	}
	defer cancel()
	resp, err := a.client.Forget(ctx, &agentv1.ForgetRequest{Uid: uid})
	if err != nil {
		return false, fmt.Errorf("forgetting task %s on node %q: %w", uid, node, err)
	}
	return resp.GetForgotten(), nil
}

// HeldTasks returns the tasks the connected agents hold, as last reported,
// except those the controller already asked them to forget.
func (r *AgentRegistry) HeldTasks() []HeldTask {
	r.mu.Lock()
	conns := make([]*agentConn, 0, len(r.agents))
	for _, a := range r.agents {
		conns = append(conns, a)
	}
	r.mu.Unlock()
	var out []HeldTask
	for _, a := range conns {
		a.mu.Lock()
		if a.connected && !a.isClosed {
			for uid, ts := range a.latest {
				if ts.GetForgetRequested() {
					continue
				}
				ref := ts.GetRef()
				out = append(out, HeldTask{Node: a.node, Task: types.NamespacedName{Namespace: ref.GetNamespace(), Name: ref.GetName()}, UID: types.UID(uid)})
			}
		}
		a.mu.Unlock()
	}
	return out
}

// agentConn is the connection to one agent and the state its Watch stream
// reported.
type agentConn struct {
	node, addr string
	cc         *grpc.ClientConn
	client     agentv1.ExecutorClient
	cancel     context.CancelFunc
	done       chan struct{}

	mu               sync.Mutex
	info             *agentv1.AgentInfo
	connected        bool
	unreachableSince time.Time // zero while connected
	running          map[string]bool
	latest           map[string]*agentv1.TaskStatus // the newest report of each task the agent holds (reported, not forgotten)
	isClosed         bool
}

func (a *agentConn) close() {
	a.mu.Lock()
	if a.isClosed {
		a.mu.Unlock()
		return
	}
	a.isClosed = true
	a.mu.Unlock()
	a.cancel()
	_ = a.cc.Close()
}

func (a *agentConn) closed() bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.isClosed
}

func (a *agentConn) unreachableSinceLocked(now time.Time) time.Time {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.connected {
		return now
	}
	return a.unreachableSince
}

func (a *agentConn) state(now time.Time) AgentState {
	a.mu.Lock()
	defer a.mu.Unlock()
	s := AgentState{Node: a.node, Connected: a.connected && !a.isClosed, Running: len(a.running)}
	if a.info != nil {
		s.Pod = a.info.GetPodName()
		s.Incarnation = a.info.GetIncarnationId()
		s.Capacity = int(a.info.GetCapacity())
		s.AmbientEnv = a.info.GetReadiness().GetAmbientEnv()
		s.Ready = s.Connected && a.info.GetReadiness().GetReady()
		s.Draining = a.info.GetReadiness().GetDraining()
		s.Isolation = a.info.GetReadiness().GetIsolation()
		s.TaskNetwork = a.info.GetReadiness().GetTaskNetwork()
		s.AllowedNetworks = slices.Clone(a.info.GetReadiness().GetAllowedNetworks())
		s.Capabilities = slices.Clone(a.info.GetReadiness().GetCapabilities())
		s.Shell = a.info.GetReadiness().GetShell()
		s.ArgEnvLimit = a.info.GetArgEnvLimitBytes()
		s.MaxRequestBytes = a.info.GetMaxRequestBytes()
		s.DiskCap = a.info.GetReadiness().GetDiskCapBytes()
		s.EnforcedLimits = slices.Clone(a.info.GetReadiness().GetEnforcedLimits())
	}
	if !s.Connected && !a.unreachableSince.IsZero() {
		s.UnreachableFor = now.Sub(a.unreachableSince)
	}
	return s
}

// observe records a task's state from a Watch event, or from an RPC reply
// (fromReply). forgotten marks a task the agent dropped.
//
// Events arrive in order on one stream, but a reply races with them: the
// STARTED and even the FINISHED event of a task can arrive before the reply
// to the Start that began it. A reply is therefore only recorded for a task
// the stream has not reported yet; otherwise its older state would replace
// a newer one and the task would look running forever.
func (a *agentConn) observe(ts *agentv1.TaskStatus, forgotten, fromReply bool) {
	if ts == nil {
		return
	}
	uid := ts.GetRef().GetUid()
	a.mu.Lock()
	defer a.mu.Unlock()
	if _, reported := a.latest[uid]; fromReply && reported {
		return
	}
	if forgotten {
		delete(a.latest, uid)
	} else {
		a.latest[uid] = ts
	}
	if ts.GetState() == agentv1.TaskState_TASK_STATE_RUNNING && !forgotten {
		a.running[uid] = true
	} else {
		delete(a.running, uid)
	}
}

// agentChanged tells AgentChanged, when set, that the agent of node
// changed; it fails only when ctx ends first.
func (r *AgentRegistry) agentChanged(ctx context.Context, node string) error {
	if r.opts.AgentChanged == nil {
		return nil
	}
	n := &corev1.Node{}
	n.Name = node
	select {
	case r.opts.AgentChanged <- event.TypedGenericEvent[*corev1.Node]{Object: n}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (a *agentConn) watchLoop(ctx context.Context, r *AgentRegistry) {
	defer close(a.done)
	backoff := wait.Backoff{Duration: 100 * time.Millisecond, Factor: 2, Jitter: 0.2, Steps: 1 << 30, Cap: 5 * time.Second}
	for ctx.Err() == nil {
		healthy, err := a.watchOnce(ctx, r)
		a.mu.Lock()
		was := a.connected
		if was {
			a.unreachableSince = r.opts.Clock.Now()
		}
		a.connected = false
		a.mu.Unlock()
		if ctx.Err() != nil {
			return
		}
		if was {
			// The node's workspaces begin to count the agent's absence
			// now, not at their next refresh.
			if r.agentChanged(ctx, a.node) != nil {
				return
			}
		}
		if healthy {
			backoff = wait.Backoff{Duration: 100 * time.Millisecond, Factor: 2, Jitter: 0.2, Steps: 1 << 30, Cap: 5 * time.Second}
		}
		code := status.Code(err)
		r.StreamEnds.WithLabelValues(code.String()).Inc()
		switch code {
		case codes.Unavailable, codes.Canceled, codes.DeadlineExceeded:
			// The agent went away or restarts: routine.
			r.opts.Log.V(1).Info("Agent watch ended; reconnecting", "node", a.node, "address", a.addr, "err", err)
		default:
			r.opts.Log.Info("Agent watch failed; reconnecting", "node", a.node, "address", a.addr, "code", code.String(), "err", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(backoff.Step()):
		}
	}
}

// watchOnce runs one Watch stream until it fails. healthy reports whether
// the stream got as far as the agent's info.
func (a *agentConn) watchOnce(ctx context.Context, r *AgentRegistry) (healthy bool, err error) {
	// The stream outlives any one renewal of the lease: only the fence is
	// taken here, not its deadline. The agent records a newer epoch before
	// it answers, which is what makes it refuse an earlier leader.
	_, cancel, fence, err := fenceFor(ctx, r.opts.Fence, "Watch")
	if err != nil {
		return false, err
	}
	cancel()
	stream, err := a.client.Watch(ctx, &agentv1.WatchRequest{Fence: fence, WorkspaceLeaseMs: r.opts.WorkspaceLease.Milliseconds()})
	if err != nil {
		return false, err
	}
	first, err := stream.Recv()
	if err != nil {
		noteFenced(r.opts.Fence, err)
		return false, err
	}
	info := first.GetAgent()
	if info == nil {
		return false, errors.New("the agent's first Watch message is not its info")
	}
	if info.GetNodeName() != "" && info.GetNodeName() != a.node {
		return false, fmt.Errorf("agent at %s says it runs on node %q, its EndpointSlice says %q", a.addr, info.GetNodeName(), a.node)
	}
	a.mu.Lock()
	// A new stream replays every task the agent holds (CURRENT events);
	// start from nothing so tasks it no longer holds are not remembered.
	a.running = map[string]bool{}
	a.latest = map[string]*agentv1.TaskStatus{}
	back := a.info != nil // an agent seen before: it returns, maybe as a new incarnation
	a.info = info
	a.connected = true
	a.unreachableSince = time.Time{}
	a.mu.Unlock()
	r.opts.Log.Info("Agent connected", "node", a.node, "pod", info.GetPodName(), "incarnation", info.GetIncarnationId(),
		"capacity", info.GetCapacity(), "ready", info.GetReadiness().GetReady(), "ambientEnv", info.GetReadiness().GetAmbientEnv(),
		"draining", info.GetReadiness().GetDraining())
	if back || info.GetReadiness().GetDraining() {
		if err := r.agentChanged(ctx, a.node); err != nil {
			return true, err
		}
	}
	for {
		msg, err := stream.Recv()
		if err != nil {
			return true, err
		}
		if info := msg.GetAgent(); info != nil {
			// The agent repeats its info when its readiness changes.
			a.mu.Lock()
			a.info = info
			a.mu.Unlock()
			r.opts.Log.V(1).Info("Agent readiness changed", "node", a.node, "ready", info.GetReadiness().GetReady(),
				"draining", info.GetReadiness().GetDraining(), "problems", info.GetReadiness().GetProblems())
			if err := r.agentChanged(ctx, a.node); err != nil {
				return true, err
			}
			continue
		}
		ev := msg.GetTask()
		if ev == nil {
			continue
		}
		ts := ev.GetStatus()
		forgotten := ev.GetType() == agentv1.EventType_EVENT_TYPE_FORGOTTEN
		a.observe(ts, forgotten, false)
		if forgotten {
			continue
		}
		ref := ts.GetRef()
		if r.opts.Held != nil && ev.GetType() == agentv1.EventType_EVENT_TYPE_CURRENT && !ts.GetForgetRequested() {
			h := HeldTask{Node: a.node, Task: types.NamespacedName{Namespace: ref.GetNamespace(), Name: ref.GetName()}, UID: types.UID(ref.GetUid())}
			select {
			case r.opts.Held <- h:
			case <-ctx.Done():
				return true, ctx.Err()
			}
		}
		if r.opts.Notify != nil && ref.GetName() != "" {
			bt := &bashtaskv1alpha1.BashTask{}
			bt.Namespace, bt.Name, bt.UID = ref.GetNamespace(), ref.GetName(), types.UID(ref.GetUid())
			select {
			case r.opts.Notify <- event.TypedGenericEvent[*bashtaskv1alpha1.BashTask]{Object: bt}:
			case <-ctx.Done():
				return true, ctx.Err()
			}
		}
	}
}
