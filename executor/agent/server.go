package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"gocloud.dev/blob"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/protobuf/proto"

	agentv1 "github.com/bashtask/bashtask-operator/api/agent/v1"
	"github.com/bashtask/bashtask-operator/executor"
	"github.com/bashtask/bashtask-operator/executor/image"
)

// Defaults of Config fields left zero.
const (
	// DefaultMaxConcurrent is the default number of tasks run at once.
	DefaultMaxConcurrent = 16
	// DefaultProgressInterval is the default minimum time between two
	// progress events of one task (--progress-interval).
	DefaultProgressInterval = 2 * time.Second
	// DefaultUploadBackoffInitial is the wait after the first failed
	// upload attempt; each further failure doubles it.
	DefaultUploadBackoffInitial = time.Second
	// DefaultUploadBackoffMax caps the wait between upload attempts.
	DefaultUploadBackoffMax = 5 * time.Minute
	// DefaultUploadTimeout bounds one upload attempt.
	DefaultUploadTimeout = 10 * time.Minute
	// DefaultReadinessInterval is how often readiness is re-evaluated.
	DefaultReadinessInterval = 5 * time.Second
	// DefaultWatchBuffer is how many events a watcher may lag behind
	// before it is disconnected.
	DefaultWatchBuffer = 1024
	// ServiceName is the gRPC service name, also the health service key.
	ServiceName = "bashtask.agent.v1.Executor"
)

// Config is the agent server's configuration (the agent's flags).
type Config struct {
	// NodeName is the node the agent runs on; required. It is reported on
	// Watch and given to tasks as BASHTASK_NODE.
	NodeName string
	// PodName is the agent's pod, reported on Watch.
	PodName string
	// StateDir is the absolute directory of task records and output; it
	// is created with mode 0700 and must not be accessible to group or
	// others.
	StateDir string
	// BucketURL is the gocloud.dev/blob URL uploads go to; the driver must
	// be linked into the binary. Empty means file://<StateDir>/uploads.
	BucketURL string
	// MaxConcurrent is the maximum number of tasks running at once;
	// zero means DefaultMaxConcurrent.
	MaxConcurrent int
	// ProgressInterval is the minimum time between two progress events
	// of one task; zero means DefaultProgressInterval.
	ProgressInterval time.Duration
	// Executor configures the executor (shell, ambient env, cgroups).
	Executor executor.Config
	// RunAs is the identity tasks run as at the process level, and at the
	// tenant level with SharedIdentity; nil means the agent's own.
	RunAs *executor.User
	// TaskUIDs is the range of UIDs leased to tasks at the tenant level,
	// one per live task; the zero value means DefaultTaskUIDRange.
	TaskUIDs UIDRange
	// SharedIdentity runs tenant-level tasks as RunAs instead of a leased
	// UID (--task-identity=shared): tasks of different owners can then
	// reach each other's files and processes; single-tenant nodes only.
	SharedIdentity bool
	// TaskNetwork is the network of a task whose spec names none (the
	// --task-network flag); empty means executor.NetworkNode. With
	// executor.NetworkNone a task asking for "Node" is refused.
	TaskNetwork executor.Network
	// AllowedNetworks are the networks a task may ask for
	// (--allowed-networks); a spec naming another is refused with
	// InvalidSpec naming the field, the value and this list. Empty allows
	// every network of the isolation level (TaskNetwork's rule aside).
	// The readiness info lists them for the controller.
	AllowedNetworks []executor.Network
	// UnenforcedLimits says what becomes of a task that asks for a limit
	// this node does not enforce (--unenforced-limits): UnenforcedWarn
	// (the zero value) runs it, its status naming the limit from its
	// start; UnenforcedRefuse ends it StartFailed naming the limit.
	UnenforcedLimits UnenforcedPolicy
	// UploadBackoffInitial and UploadBackoffMax shape the capped
	// exponential backoff between upload attempts; zero means the
	// defaults.
	UploadBackoffInitial, UploadBackoffMax time.Duration
	// UploadTimeout bounds one upload attempt; zero means
	// DefaultUploadTimeout.
	UploadTimeout time.Duration
	// PartBytes is the largest part of a running task's stream uploaded
	// while it runs (--output-part-bytes, docs/output.md); zero means
	// DefaultPartBytes, a negative value turns part uploads off.
	PartBytes int64
	// PartInterval is the longest new bytes of a running stream wait for
	// a part (--output-part-interval); zero means DefaultPartInterval.
	PartInterval time.Duration
	// ReadinessInterval is how often readiness is re-evaluated; zero
	// means DefaultReadinessInterval.
	ReadinessInterval time.Duration
	// CertCheck, when set, reports whether the serving certificates are
	// usable at the given time; its error makes the agent not ready.
	CertCheck func(time.Time) error
	// WatchBuffer is how many events a watcher may lag behind; zero
	// means DefaultWatchBuffer.
	WatchBuffer int
	// Logger receives the server's logs; nil means slog.Default().
	Logger *slog.Logger
	// Metrics receives the server's metrics; nil means unregistered ones.
	Metrics *Metrics
	// MaxWorkspaces is how many workspaces the agent holds at most
	// (--max-workspaces); zero means DefaultMaxWorkspaces.
	MaxWorkspaces int
	// Images configures the image store and the pulls (docs/images.md,
	// "On the agent"); the store is opened at the tenant level only.
	Images ImageConfig
	// DrainUnwatchedLimit is how long Drain goes on while no Watch stream
	// is open: the controller moves workspaces only while it watches, so
	// with none for this long nothing will move. Zero means
	// DefaultDrainUnwatchedLimit.
	DrainUnwatchedLimit time.Duration
}

// Server serves the Executor protocol. Create it with New, start its
// background work with Run, register it on a gRPC server with Register,
// and Close it after Run returned.
type Server struct {
	agentv1.UnimplementedExecutorServer

	cfg         Config
	log         *slog.Logger
	store       *store
	fence       *fencing
	lease       *executor.Lease // the node's lease on its workspaces (workspace_lease.go)
	incarnation string
	bucket      *blob.Bucket
	bucketBase  string // bucket URL without query, for object URLs
	// nodeLocalBucket is set when the bucket is the default directory
	// in the state directory (no --output-bucket-url): no other node reads it.
	nodeLocalBucket bool
	metrics         *Metrics
	health          *health.Server
	wake            chan struct{} // wakes the uploader; capacity 1
	stopCh          chan struct{} // closed when Run begins to shut down
	tasksWG         sync.WaitGroup

	mu       sync.Mutex
	ex       *executor.Executor // nil while executor.New fails (missing shell)
	leases   *uidLeases         // nil unless tasks get a leased UID
	ws       *workspaces        // the Workspaces service and its table
	pf       *portForwards      // the PortForward service (portforward.go)
	images   *images            // the image store and its pulls (images.go)
	tasks    map[string]*entry
	running  int
	watchers map[*watcher]struct{}
	problems []string
	stopping bool
	// draining is set by Drain: the agent moves its workspaces off
	// before it stops, takes no new task or workspace, and is not ready.
	draining bool
}

// entry is one task in the table. Guarded by Server.mu.
type entry struct {
	rec    *record
	status *agentv1.TaskStatus
	// task is the executor's handle; nil for a task that never started,
	// that is still starting, or that an earlier incarnation ran.
	task *executor.Task
	// cancelled is set by the Cancel RPC; stopByAgent when the agent's
	// shutdown cancelled the task and no Cancel came before.
	cancelled, stopByAgent bool
	// uploads are the objects still to upload (stdout, stderr and the
	// order journal, uploadNames).
	uploads [3]*uploadJob
	// parts are the part uploads of the running task's streams and its
	// order journal, as uploads (parts.go).
	parts [3]partState
	// sentKept are the kept byte counts of the last progress event.
	sentKept [2]int64
	// img holds the image of a task without a workspace while it runs
	// (released when it finishes); nil on the node's root.
	img *image.Image
}

// releaseImage lets go of the task's image, if it holds one.
func (e *entry) releaseImage() {
	if e.img != nil {
		e.img.Release()
		e.img = nil
	}
}

// starting reports whether Start is still creating the task outside the
// lock: running, with no executor handle yet (a task an earlier incarnation
// ran is recovered as finished). The entry then holds copies of its record
// and status, and a Cancel is remembered in cancelled and applied once the
// process exists.
func (e *entry) starting() bool {
	return e.task == nil && e.status.State == agentv1.TaskState_TASK_STATE_RUNNING
}

type uploadJob struct {
	next     time.Time
	inFlight bool
}

// IncarnationID is the random id of this agent process, new at every start.
func (s *Server) IncarnationID() string { return s.incarnation }

// BucketURL is the bucket URL uploads go to (the default filled in).
func (s *Server) BucketURL() string { return s.cfg.BucketURL }

// Health is the gRPC health service; Register adds it to a gRPC server.
func (s *Server) Health() *health.Server { return s.health }

// Readiness reports whether the agent accepts tasks and, if not, why.
func (s *Server) Readiness() (bool, []string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.readinessLocked()
}

// Run does the server's background work until ctx ends: progress events,
// uploads and readiness checks. When ctx ends it stops accepting tasks,
// cancels the running tasks (TERM, grace, KILL; they finish with reason
// AgentRestarted), closes the image store, and once they are recorded and
// their terminal events sent, ends every Watch stream and returns. Uploads still pending are
// retried by the next incarnation.
func (s *Server) Run(ctx context.Context) error {
	var wg sync.WaitGroup
	loopCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	wg.Go(func() { s.progressLoop(loopCtx) })
	wg.Go(func() { s.uploadLoop(loopCtx) })
	wg.Go(func() { s.partsLoop(loopCtx) })
	wg.Go(func() { s.readinessLoop(loopCtx) })
	<-ctx.Done()

	s.mu.Lock()
	s.stopping = true
	s.health.Shutdown()
	n := s.stopRunningLocked()
	s.mu.Unlock()
	if n > 0 {
		s.log.Info("stopping running tasks for shutdown", "tasks", n)
	}
	s.tasksWG.Wait()
	// No task runs and none starts: the image store's lock goes with Run,
	// as with the process, so that a new agent on the same state
	// directory opens it.
	if err := s.images.close(); err != nil {
		s.log.Error("closing the image store", "err", err)
	}
	// Only now: watchers have received the terminal events.
	close(s.stopCh)
	cancel()
	wg.Wait()
	return nil
}

// Close releases the bucket and the executor's parent cgroup. Call it after
// Run returned.
func (s *Server) Close() error {
	var errs []error
	if err := s.bucket.Close(); err != nil {
		errs = append(errs, fmt.Errorf("closing bucket: %w", err))
	}
	if err := s.store.close(); err != nil {
		errs = append(errs, fmt.Errorf("closing the record journal: %w", err))
	}
	s.ws.closeAll()
	if err := s.images.close(); err != nil {
		errs = append(errs, fmt.Errorf("closing the image store: %w", err))
	}
	s.lease.Close()
	s.mu.Lock()
	ex := s.ex
	s.mu.Unlock()
	if ex != nil {
		if err := ex.Close(); err != nil {
			errs = append(errs, fmt.Errorf("closing executor: %w", err))
		}
	}
	return errors.Join(errs...)
}

// Register adds the Executor, Workspaces, Terminal and PortForward services and the
// health service to g.
func (s *Server) Register(g grpc.ServiceRegistrar) {
	agentv1.RegisterExecutorServer(g, s)
	agentv1.RegisterWorkspacesServer(g, s.ws)
	agentv1.RegisterTerminalServer(g, &terminalServer{s: s})
	agentv1.RegisterPortForwardServer(g, s.pf)
	healthpb.RegisterHealthServer(g, s.health)
}

func cmpOr[T comparable](v, def T) T {
	var zero T
	if v == zero {
		return def
	}
	return v
}

func clone(st *agentv1.TaskStatus) *agentv1.TaskStatus { return proto.CloneOf(st) }
