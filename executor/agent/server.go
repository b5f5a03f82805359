package agent

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"gocloud.dev/blob"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	agentv1 "github.com/bashtask/bashtask-operator/api/agent/v1"
	"github.com/bashtask/bashtask-operator/executor"
)

// Defaults of Config fields left zero.
const (
	// DefaultMaxConcurrent is the default number of tasks run at once.
	DefaultMaxConcurrent = 16
	// DefaultProgressInterval is the default minimum time between two
	// progress events of one task (DESIGN.md: --progress-interval, 2 s).
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
	// uploads are the streams still to upload (stdout, stderr).
	uploads [2]*uploadJob
	// parts are the part uploads of the running task's streams (parts.go).
	parts [2]partState
	// sentKept are the kept byte counts of the last progress event.
	sentKept [2]int64
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

type watcher struct {
	ch chan *agentv1.WatchResponse
}

// New prepares the state directory, opens the bucket, recovers the tasks of
// an earlier incarnation (stopping their leftover processes) and creates the
// executor. A missing shell is not an error here: the agent then serves,
// reports not ready and retries at each readiness check (case C28). It
// returns an error for a bad configuration, an unusable state directory or a
// bucket URL that cannot be opened.
func New(ctx context.Context, cfg Config) (_ *Server, err error) {
	if cfg.NodeName == "" {
		return nil, errors.New("agent: node name is required")
	}
	if cfg.Executor.Isolation == executor.IsolationTenant && cfg.SharedIdentity && cfg.RunAs == nil {
		// The shim would stay root: the namespaces alone do not make a
		// tenant.
		return nil, errors.New("agent: a shared task identity at the tenant isolation level needs a user to run tasks as (--run-as-user)")
	}
	if err := prepareStateDir(cfg.StateDir); err != nil {
		return nil, err
	}
	fence, err := loadFencing(cfg.StateDir)
	if err != nil {
		return nil, err
	}
	setDefaults(&cfg)
	s := &Server{
		cfg:      cfg,
		log:      cfg.Logger,
		metrics:  cfg.Metrics,
		health:   health.NewServer(),
		wake:     make(chan struct{}, 1),
		stopCh:   make(chan struct{}),
		tasks:    map[string]*entry{},
		watchers: map[*watcher]struct{}{},
		fence:    fence,
		lease:    executor.NewLease(),
	}
	s.cfg.Executor.Lease = s.lease
	s.metrics.LeaderEpoch.Set(float64(fence.current().GetEpoch()))
	st, err := openStore(cfg.StateDir, filepath.Join(cfg.StateDir, "tasks"))
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			_ = st.close()
		}
	}()
	s.store = st
	if st.damaged != nil {
		s.log.Warn("record journal: discarded its damaged end (an agent killed mid-write leaves one)", "reason", st.damaged)
	}
	var id [8]byte
	_, _ = rand.Read(id[:])
	s.incarnation = hex.EncodeToString(id[:])
	if s.cfg.Executor.AmbientEnv == executor.AmbientInherit {
		s.log.Warn("ambient environment mode inherit: tasks receive this agent's whole environment without the credential scrub",
			"ambientEnv", string(executor.AmbientInherit))
	}

	bucketURL := cfg.BucketURL
	if bucketURL == "" {
		dir := filepath.Join(cfg.StateDir, "uploads")
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return nil, fmt.Errorf("creating default upload directory: %w", err)
		}
		// Temporary files next to the objects: the state directory is
		// usually a hostPath on another file system than /tmp, and
		// fileblob renames them into place.
		bucketURL = "file://" + dir + "?no_tmp_dir=true"
		s.cfg.BucketURL = bucketURL
		// This node's own directory: a snapshot written here restores
		// nowhere else, so the agent offers none.
		s.nodeLocalBucket = true
	}
	u, err := url.Parse(bucketURL)
	if err != nil {
		return nil, fmt.Errorf("parsing bucket URL: %w", err)
	}
	// Object URLs in statuses name the bucket and key only: no query
	// parameters or user information that might hold credentials.
	u.RawQuery, u.Fragment, u.User = "", "", nil
	s.bucketBase = strings.TrimSuffix(u.String(), "/")
	if s.bucket, err = blob.OpenBucket(ctx, bucketURL); err != nil {
		return nil, fmt.Errorf("opening bucket %s: %w", s.bucketBase, err)
	}

	if cfg.Executor.Isolation == executor.IsolationTenant {
		// Tasks must not read the records, output and uploads of others,
		// nor the bucket's credentials, whatever the files' modes.
		s.cfg.Executor.MaskPaths = append(slices.Clip(s.cfg.Executor.MaskPaths), credentialFiles(os.Getenv)...)
		stateDir, err := filepath.Abs(cfg.StateDir)
		if err != nil {
			return nil, fmt.Errorf("the state directory %s: %w", cfg.StateDir, err)
		}
		s.cfg.Executor.MaskPaths = append(s.cfg.Executor.MaskPaths, stateDir)
		if s.cfg.Executor.DiskQuotaBytes > 0 && s.cfg.Executor.DiskImageDir == "" {
			// The working directories' images: the agent's own, hidden
			// from tasks with the rest of the state directory.
			s.cfg.Executor.DiskImageDir = filepath.Join(stateDir, "disk-images")
		}
	}
	if cfg.Executor.Isolation == executor.IsolationTenant && !cfg.SharedIdentity {
		r := cfg.TaskUIDs
		if r == (UIDRange{}) {
			r = DefaultTaskUIDRange
		}
		s.leases = newUIDLeases(r)
	}
	// The workspaces' UIDs are held before any task's is handed out.
	if s.ws, err = newWorkspaces(s); err != nil {
		return nil, err
	}
	// Recovery runs before the executor exists, so the earlier
	// incarnation's cgroups are gone before the new one sets up its parent.
	s.recoverTasks()
	s.mu.Lock()
	s.updateReadinessLocked()
	s.mu.Unlock()
	s.ws.takeUp(ctx)
	return s, nil
}

func setDefaults(cfg *Config) {
	if cfg.MaxConcurrent <= 0 {
		cfg.MaxConcurrent = DefaultMaxConcurrent
	}
	if cfg.ProgressInterval <= 0 {
		cfg.ProgressInterval = DefaultProgressInterval
	}
	if cfg.UploadBackoffInitial <= 0 {
		cfg.UploadBackoffInitial = DefaultUploadBackoffInitial
	}
	if cfg.UploadBackoffMax <= 0 {
		cfg.UploadBackoffMax = DefaultUploadBackoffMax
	}
	if cfg.UploadTimeout <= 0 {
		cfg.UploadTimeout = DefaultUploadTimeout
	}
	if cfg.PartBytes == 0 {
		cfg.PartBytes = DefaultPartBytes
	}
	if cfg.PartInterval <= 0 {
		cfg.PartInterval = DefaultPartInterval
	}
	if cfg.ReadinessInterval <= 0 {
		cfg.ReadinessInterval = DefaultReadinessInterval
	}
	if cfg.WatchBuffer <= 0 {
		cfg.WatchBuffer = DefaultWatchBuffer
	}
	if cfg.DrainUnwatchedLimit <= 0 {
		cfg.DrainUnwatchedLimit = DefaultDrainUnwatchedLimit
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Metrics == nil {
		cfg.Metrics, _ = NewMetrics(nil) // unregistered: cannot fail
	}
	if cfg.Executor.Shell == "" {
		cfg.Executor.Shell = executor.DefaultShell
	}
	if cfg.Executor.AmbientEnv == "" {
		cfg.Executor.AmbientEnv = executor.AmbientScrub
	}
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
// AgentRestarted), and once they are recorded and their terminal events
// sent, ends every Watch stream and returns. Uploads still pending are
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

// Register adds the Executor service and the health service to g.
func (s *Server) Register(g grpc.ServiceRegistrar) {
	agentv1.RegisterExecutorServer(g, s)
	agentv1.RegisterWorkspacesServer(g, s.ws)
	healthpb.RegisterHealthServer(g, s.health)
}

// Start implements the Start RPC.
func (s *Server) Start(ctx context.Context, req *agentv1.StartRequest) (*agentv1.StartResponse, error) {
	release, err := s.admitFence(ctx, "Start", req.GetFence())
	if err != nil {
		return nil, err
	}
	defer release()
	spec := req.GetSpec()
	if err := validateSpec(spec); err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	digest, err := specDigest(spec)
	if err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	uid := spec.GetRef().GetUid()
	log := s.log.With("uid", uid, "namespace", spec.GetRef().GetNamespace(), "name", spec.GetRef().GetName())

	// Under the lock, only the decisions: idempotency per UID, readiness
	// and capacity, with the slot taken and the UID entered in the table at
	// once, so a concurrent Start of the same UID finds it and a concurrent
	// one of another UID sees the slot gone. The slow part, the record on
	// disk and the executor creating directories, files and the process,
	// runs outside it: holding the agent's one lock across it would make
	// every Start, finish and RPC of the node wait behind one fork.
	s.mu.Lock()
	if e, ok := s.tasks[uid]; ok {
		defer s.mu.Unlock()
		if e.status.GetSpecDigest() != digest {
			return nil, status.Errorf(codes.FailedPrecondition, "task %s is known with a different spec", uid)
		}
		return &agentv1.StartResponse{Status: clone(e.status), AlreadyKnown: true}, nil
	}
	var refuse error
	switch {
	case s.stopping || s.draining:
		refuse = status.Error(codes.Unavailable, "agent is shutting down")
	case s.ex == nil || len(s.problems) > 0:
		refuse = status.Errorf(codes.Unavailable, "agent is not ready: %s", strings.Join(s.problems, "; "))
	case s.running >= s.cfg.MaxConcurrent:
		refuse = status.Errorf(codes.ResourceExhausted, "agent runs its maximum of %d tasks", s.cfg.MaxConcurrent)
	}
	var leased *uint32
	if refuse == nil && s.leases != nil && spec.GetWorkspace() == nil {
		if u, ok := s.leases.acquire(uid); ok {
			leased = &u
		} else {
			refuse = status.Errorf(codes.ResourceExhausted, "every UID of the task range %s is leased", s.leases.r)
		}
	}
	if refuse == nil {
		if s.store.exists(uid) {
			// Files without a readable record: recovery logged why.
			// Running anything over them could mix two tasks' output.
			refuse = status.Errorf(codes.FailedPrecondition, "task %s has leftover files in the state directory", uid)
		}
	}
	if refuse != nil {
		if leased != nil {
			s.leases.release(*leased)
		}
		s.mu.Unlock()
		return nil, refuse
	}
	ex := s.ex
	es := s.toExecSpec(spec)
	if leased != nil {
		es.User = &executor.User{UID: *leased, GID: *leased}
	}
	st := &agentv1.TaskStatus{
		Ref:           proto.CloneOf(spec.GetRef()),
		State:         agentv1.TaskState_TASK_STATE_RUNNING,
		ExitCode:      -1,
		Mechanism:     string(ex.Mechanism()),
		IncarnationId: s.incarnation,
		SpecDigest:    digest,
	}
	rec := &record{
		State:           stateStarting,
		Upload:          spec.GetOutput().GetUpload(),
		TailBytes:       cmpOr(es.TailBytes, executor.DefaultTailBytes),
		SpillLimitBytes: cmpOr(es.SpillLimitBytes, executor.DefaultSpillLimitBytes),
		Process:         processRecord{BootID: bootID(), TaskUID: leased},
	}
	if ex.Mechanism() == executor.MechanismCgroup {
		rec.Process.Cgroup = filepath.Join(ex.CgroupPath(), uid)
	}
	// The table holds copies until the start is done: rec and st are this
	// call's own while it works outside the lock.
	recCopy := *rec
	e := &entry{rec: &recCopy, status: clone(st)}
	s.tasks[uid] = e
	s.running++
	s.metrics.Running.Set(float64(s.running))
	s.tasksWG.Add(1) // a shutdown waits for this start, then for the task
	s.mu.Unlock()

	if err := s.store.write(uid, rec, st); err != nil {
		// Nothing ran; leave no directory that would block a retry.
		if rerr := s.store.remove(uid); rerr != nil {
			log.Error("removing the directory of a task that did not start", "err", rerr)
		}
		s.mu.Lock()
		delete(s.tasks, uid)
		if leased != nil {
			s.leases.release(*leased) // nothing was started
		}
		s.running--
		s.metrics.Running.Set(float64(s.running))
		s.mu.Unlock()
		s.tasksWG.Done()
		return nil, status.Error(codes.Internal, err.Error())
	}

	task, err := (*executor.Task)(nil), s.networkError(spec)
	if spec.GetWorkspace() != nil {
		err = s.ws.bindTask(uid, spec, &es) // its UID, network and directory
	}
	if err == nil {
		task, err = ex.Start(es)
	}
	if err != nil {
		// Nothing of the command ran: a finished task, not an RPC error.
		log.Info("task did not start", "err", err)
		s.mu.Lock()
		defer s.mu.Unlock()
		e.rec, e.status = rec, st
		s.running--
		s.metrics.Running.Set(float64(s.running))
		s.finishLocked(e, executor.StartFailedResult(err))
		s.tasksWG.Done()
		return &agentv1.StartResponse{Status: clone(e.status)}, nil
	}
	rec.State = stateRunning
	if ex.Isolation() == executor.IsolationTenant {
		source := "started"
		if task.PooledShim() {
			source = "pool"
		}
		s.metrics.TaskShims.WithLabelValues(source).Inc()
	}
	rec.Process.PID, rec.Process.StartTicks = task.PID(), task.ProcessStart()
	rec.Process.Cgroup = task.CgroupPath()
	// What the task got is known now: a running task shows it, not only
	// a finished one.
	st.Isolation = taskIsolation(task.Isolation())
	if es.WorkingDir == "" && es.Workspace == nil {
		rec.Process.WorkDir = task.WorkingDir()
	}
	st.WorkingDir, _ = task.StartDir()
	st.StartTime = timestamppb.Now()
	if err := s.store.write(uid, rec, st); err != nil {
		// The task runs; a later record write may succeed. Recovery still
		// finds it through its cgroup and environment.
		log.Error("recording started task", "err", err)
	}

	s.mu.Lock()
	defer s.mu.Unlock()
	e.rec, e.status, e.task = rec, st, task
	switch {
	case s.stopping || s.draining:
		// The shutdown began while the process was being created; it
		// waits for this task like for the others.
		e.stopByAgent = !e.cancelled
		task.Cancel()
	case e.cancelled:
		task.Cancel() // a Cancel arrived during the start
	}
	s.broadcastLocked(taskEvent(agentv1.EventType_EVENT_TYPE_STARTED, st))
	log.Info("task started", "pid", rec.Process.PID)
	go s.waitTask(e)
	return &agentv1.StartResponse{Status: clone(st)}, nil
}

func cmpOr[T comparable](v, def T) T {
	var zero T
	if v == zero {
		return def
	}
	return v
}

// validateSpec checks what the agent itself relies on: the reference, which
// becomes a directory name, a cgroup name and an object key. Everything
// about the command is checked by the executor and reported as StartFailed.
func validateSpec(spec *agentv1.TaskSpec) error {
	ref := spec.GetRef()
	switch {
	case spec == nil:
		return errors.New("spec is required")
	case !validUID.MatchString(ref.GetUid()):
		return fmt.Errorf("ref.uid %q must be 1 to 128 letters, digits, '-', '_' or '.'", ref.GetUid())
	case !validObjectName(ref.GetNamespace()):
		return fmt.Errorf("ref.namespace %q must be a non-empty name without '/'", ref.GetNamespace())
	case !validObjectName(ref.GetName()):
		return fmt.Errorf("ref.name %q must be a non-empty name without '/'", ref.GetName())
	}
	return nil
}

func validObjectName(n string) bool {
	return n != "" && len(n) <= 253 && !strings.ContainsAny(n, "/\x00") && n != "." && n != ".."
}

// waitTask waits for a task's end and records it.
func (s *Server) waitTask(e *entry) {
	defer s.tasksWG.Done()
	res, _ := e.task.Wait(context.Background()) // cannot fail without a deadline
	s.mu.Lock()
	defer s.mu.Unlock()
	s.running--
	s.metrics.Running.Set(float64(s.running))
	if e.stopByAgent && res.Reason == executor.ReasonCancelled {
		// Not the user's cancel: the agent stopped it to shut down.
		res.Reason = ReasonAgentRestarted
		res.Message = "the agent shut down while the task ran; the task was stopped"
	}
	s.metrics.LeftoverKilled.Add(float64(res.LeftoverProcesses))
	s.metrics.OutputBytes.WithLabelValues("stdout").Add(float64(res.Stdout.TotalBytes))
	s.metrics.OutputBytes.WithLabelValues("stderr").Add(float64(res.Stderr.TotalBytes))
	s.finishLocked(e, res)
}

// finishLocked records a task's result, decides its uploads and sends the
// terminal event at once: uploads never hold it back.
func (s *Server) finishLocked(e *entry, res executor.Result) {
	uid := e.status.GetRef().GetUid()
	applyResult(e.status, res)
	e.setKeptLocked()
	applyStdin(e.status, e.task)
	s.ws.taskEndedLocked(uid, e.status.GetRef().GetName(), res)
	s.planUploadsLocked(e, false)
	e.rec.State = stateFinished
	if !res.CleanupFailed {
		// The executor's task is over only once its cgroup is empty and
		// its fresh working directory removed; its /tmp and /dev/shm died
		// with its mount namespace.
		s.releaseLeaseLocked(e)
	} else if e.rec.Process.TaskUID != nil {
		s.log.Error("keeping the task's UID leased: its cgroup or working directory is left", "uid", uid, "taskUID", *e.rec.Process.TaskUID)
	}
	if err := s.store.write(uid, e.rec, e.status); err != nil {
		s.log.Error("recording finished task", "uid", uid, "err", err)
	}
	s.metrics.Finished.WithLabelValues(e.status.Reason).Inc()
	s.broadcastLocked(taskEvent(agentv1.EventType_EVENT_TYPE_FINISHED, e.status))
	s.log.Info("task finished", "uid", uid, "reason", e.status.Reason, "exitCode", e.status.ExitCode)
	if e.pendingUploads() > 0 {
		s.kickUploader()
	}
}

// credentialEnv name files of cloud credentials the bucket drivers read,
// and serviceAccountDirs the agent pod's Kubernetes credentials.
var (
	credentialEnv = []string{
		"AWS_SHARED_CREDENTIALS_FILE", "AWS_CONFIG_FILE", "AWS_WEB_IDENTITY_TOKEN_FILE",
		"GOOGLE_APPLICATION_CREDENTIALS", "AZURE_CLIENT_CERTIFICATE_PATH", "AZURE_FEDERATED_TOKEN_FILE",
	}
	serviceAccountDirs = []string{"/var/run/secrets/kubernetes.io", "/run/secrets/kubernetes.io", "/var/run/secrets/eks.amazonaws.com"}
)

// credentialFiles lists the credential files and directories hidden from
// tenant tasks: those named by credentialEnv in the agent's environment
// (absolute paths only) and serviceAccountDirs.
func credentialFiles(getenv func(string) string) []string {
	var out []string
	for _, name := range credentialEnv {
		if v := getenv(name); filepath.IsAbs(v) {
			out = append(out, v)
		}
	}
	return append(out, serviceAccountDirs...)
}

// releaseLeaseLocked returns the task's UID to the pool; the record is
// written by the caller.
func (s *Server) releaseLeaseLocked(e *entry) {
	p := &e.rec.Process
	if p.TaskUID == nil || p.LeaseReleased {
		return
	}
	p.LeaseReleased = true
	if s.leases != nil && s.leases.held[*p.TaskUID] == e.status.GetRef().GetUid() {
		s.leases.release(*p.TaskUID)
	}
}

// Cancel implements the Cancel RPC.
func (s *Server) Cancel(ctx context.Context, req *agentv1.CancelRequest) (*agentv1.CancelResponse, error) {
	release, err := s.admitFence(ctx, "Cancel", req.GetFence())
	if err != nil {
		return nil, err
	}
	defer release()
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.tasks[req.GetUid()]
	if !ok {
		return nil, status.Errorf(codes.NotFound, "task %s is not known", req.GetUid())
	}
	switch {
	case e.starting():
		e.cancelled = true // Start cancels the task once it exists
	case e.task != nil && e.status.State == agentv1.TaskState_TASK_STATE_RUNNING:
		e.cancelled = true
		e.task.Cancel() // idempotent; no effect once the shell exited
	}
	return &agentv1.CancelResponse{Status: clone(e.status)}, nil
}

// Get implements the Get RPC.
func (s *Server) Get(_ context.Context, req *agentv1.GetRequest) (*agentv1.GetResponse, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.tasks[req.GetUid()]
	if !ok {
		return nil, status.Errorf(codes.NotFound, "task %s is not known", req.GetUid())
	}
	s.refreshLocked(e)
	return &agentv1.GetResponse{Status: clone(e.status)}, nil
}

// Page bounds of the List RPC.
const (
	// DefaultListPageSize is the page size of a List request that names
	// none.
	DefaultListPageSize = 100
	// MaxListPageSize is the largest page size a List request gets.
	MaxListPageSize = 1000
	// MaxListPageBytes bounds the encoded statuses of one List page (but
	// for a page of a single task): 1 MiB, a quarter of gRPC's default
	// 4 MiB receive limit, whatever the number of tasks and their tails.
	MaxListPageBytes = 1 << 20
)

// List implements the List RPC: one page of the tasks, sorted by UID,
// starting after the page token (the last UID of the previous page).
func (s *Server) List(_ context.Context, req *agentv1.ListRequest) (*agentv1.ListResponse, error) {
	size := int(req.GetPageSize())
	switch {
	case size < 0:
		return nil, status.Errorf(codes.InvalidArgument, "page_size %d is negative", size)
	case size == 0:
		size = DefaultListPageSize
	case size > MaxListPageSize:
		size = MaxListPageSize
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	uids := s.sortedUIDsLocked()
	start, _ := slices.BinarySearch(uids, req.GetPageToken())
	if tok := req.GetPageToken(); tok != "" && start < len(uids) && uids[start] == tok {
		start++
	}
	resp := &agentv1.ListResponse{}
	bytes := 0
	for i := start; i < len(uids); i++ {
		e := s.tasks[uids[i]]
		s.refreshLocked(e)
		st := clone(e.status)
		n := proto.Size(st)
		if len(resp.Tasks) == size || (len(resp.Tasks) > 0 && bytes+n > MaxListPageBytes) {
			resp.NextPageToken = uids[i-1]
			break
		}
		resp.Tasks = append(resp.Tasks, st)
		bytes += n
	}
	return resp, nil
}

// admitFence applies the leader fence of a Start, Cancel or Watch request
// (see fencing). A refused request is counted and logged; a newer epoch
// is logged once. release ends the request's hold on the fence.
func (s *Server) admitFence(ctx context.Context, rpc string, got *agentv1.Fence) (release func(), err error) {
	if err := ctx.Err(); err != nil {
		// The caller gave up (its deadline passed, as when a paused
		// controller resumes): nothing it asked for should happen now.
		return nil, status.FromContextError(err).Err()
	}
	release, newEpoch, err := s.fence.admit(rpc, got)
	if err != nil {
		if status.Code(err) == codes.FailedPrecondition {
			s.metrics.FencedRequests.WithLabelValues(rpc).Inc()
			s.log.Warn("refused a request from an earlier leader", "rpc", rpc, "epoch", got.GetEpoch(), "holder", got.GetHolder(), "err", err)
		}
		return nil, err
	}
	if newEpoch {
		s.metrics.LeaderEpoch.Set(float64(got.GetEpoch()))
		s.log.Info("new leader epoch", "rpc", rpc, "epoch", got.GetEpoch(), "holder", got.GetHolder())
	}
	return release, nil
}

// Forget implements the Forget RPC.
func (s *Server) Forget(_ context.Context, req *agentv1.ForgetRequest) (*agentv1.ForgetResponse, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	uid := req.GetUid()
	e, ok := s.tasks[uid]
	if !ok {
		return &agentv1.ForgetResponse{Forgotten: true}, nil
	}
	if e.status.State != agentv1.TaskState_TASK_STATE_FINISHED {
		return nil, status.Errorf(codes.FailedPrecondition, "task %s is still running", uid)
	}
	e.status.ForgetRequested = true
	if e.pendingUploads() > 0 {
		if err := s.store.write(uid, e.rec, e.status); err != nil {
			return nil, status.Error(codes.Internal, err.Error())
		}
		return &agentv1.ForgetResponse{Forgotten: false}, nil
	}
	if err := s.forgetLocked(e); err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	}
	return &agentv1.ForgetResponse{Forgotten: true}, nil
}

// forgetLocked deletes a finished task whose uploads are done.
func (s *Server) forgetLocked(e *entry) error {
	uid := e.status.GetRef().GetUid()
	if err := s.store.remove(uid); err != nil {
		return err
	}
	delete(s.tasks, uid)
	s.broadcastLocked(taskEvent(agentv1.EventType_EVENT_TYPE_FORGOTTEN, e.status))
	s.log.Info("task forgotten", "uid", uid)
	return nil
}

// Watch implements the Watch RPC.
func (s *Server) Watch(req *agentv1.WatchRequest, stream agentv1.Executor_WatchServer) error {
	release, err := s.admitFence(stream.Context(), "Watch", req.GetFence())
	if err != nil {
		return err
	}
	// The stream only reports: it does not hold the fence while it lasts.
	release()
	// It holds the node's lease on its workspaces while it lasts.
	defer s.holdLease(req.GetWorkspaceLeaseMs())()
	s.mu.Lock()
	if s.stopping {
		s.mu.Unlock()
		return status.Error(codes.Unavailable, "agent is shutting down")
	}
	// Subscribing and taking the current state under one lock means no
	// event falls between the two.
	w := &watcher{ch: make(chan *agentv1.WatchResponse, s.cfg.WatchBuffer)}
	s.watchers[w] = struct{}{}
	first := []*agentv1.WatchResponse{{Event: &agentv1.WatchResponse_Agent{Agent: s.agentInfoLocked()}}}
	for _, uid := range s.sortedUIDsLocked() {
		e := s.tasks[uid]
		s.refreshLocked(e)
		first = append(first, taskEvent(agentv1.EventType_EVENT_TYPE_CURRENT, e.status))
	}
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.watchers, w)
		s.mu.Unlock()
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
		case <-s.stopCh:
			// Run closes stopCh after the tasks the shutdown stopped have
			// queued their terminal events; send those before ending, or
			// select's random choice would drop them half the time.
			for {
				select {
				case m, ok := <-w.ch:
					if !ok {
						return status.Errorf(codes.ResourceExhausted, "watcher fell more than %d events behind; watch again", s.cfg.WatchBuffer)
					}
					if err := stream.Send(m); err != nil {
						return err
					}
				default:
					return status.Error(codes.Unavailable, "agent is shutting down")
				}
			}
		case m, ok := <-w.ch:
			if !ok {
				return status.Errorf(codes.ResourceExhausted, "watcher fell more than %d events behind; watch again", s.cfg.WatchBuffer)
			}
			if err := stream.Send(m); err != nil {
				return err
			}
		}
	}
}

// broadcastLocked queues m for every watcher; a watcher whose buffer is full
// is dropped (its channel closed) rather than blocking the agent.
func (s *Server) broadcastLocked(m *agentv1.WatchResponse) {
	for w := range s.watchers {
		select {
		case w.ch <- m:
		default:
			close(w.ch)
			delete(s.watchers, w)
		}
	}
}

func (s *Server) sortedUIDsLocked() []string {
	uids := make([]string, 0, len(s.tasks))
	for uid := range s.tasks {
		uids = append(uids, uid)
	}
	slices.Sort(uids)
	return uids
}

// refreshLocked brings a running task's output into its status.
func (s *Server) refreshLocked(e *entry) {
	if e.task != nil && e.status.State == agentv1.TaskState_TASK_STATE_RUNNING {
		applySnapshot(e.status, e.task.Snapshot())
		e.setKeptLocked()
	}
}

func (s *Server) agentInfoLocked() *agentv1.AgentInfo {
	ready, problems := s.readinessLocked()
	r := &agentv1.Readiness{
		Ready:      ready,
		Problems:   problems,
		AmbientEnv: string(s.cfg.Executor.AmbientEnv),
		Shell:      s.cfg.Executor.Shell,
		Draining:   s.draining,
	}
	r.Isolation = string(cmpOr(s.cfg.Executor.Isolation, executor.IsolationProcess))
	r.TaskNetwork = apiNetwork(cmpOr(s.cfg.TaskNetwork, executor.NetworkNode))
	r.AllowedNetworks = s.allowedNetworkNames()
	if s.ex != nil {
		r.AmbientEnv = string(s.ex.AmbientMode())
		r.Mechanism = string(s.ex.Mechanism())
		r.CgroupControllers = s.ex.Controllers()
		caps := s.ex.Capabilities()
		r.Capabilities = caps.Names()
		r.Capabilities = append(r.Capabilities, s.ws.capabilitiesLocked()...)
		r.LandlockAbi = int32(caps.LandlockABI)
		r.DiskCapBytes = s.ex.DiskCap()
	}
	return &agentv1.AgentInfo{
		NodeName:         s.cfg.NodeName,
		PodName:          s.cfg.PodName,
		IncarnationId:    s.incarnation,
		Capacity:         int32(s.cfg.MaxConcurrent),
		Running:          int32(s.running),
		Readiness:        r,
		ArgEnvLimitBytes: executor.CurrentArgEnvLimit(),
		MaxRequestBytes:  agentv1.MaxRequestBytes,
		Fence:            s.fence.current(),
	}
}

// progressLoop sends a progress event for each running task whose output
// changed since its last event, at most once per ProgressInterval.
func (s *Server) progressLoop(ctx context.Context) {
	t := time.NewTicker(s.cfg.ProgressInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		s.mu.Lock()
		for _, uid := range s.sortedUIDsLocked() {
			e := s.tasks[uid]
			if e.task == nil || e.status.State != agentv1.TaskState_TASK_STATE_RUNNING {
				continue
			}
			snap := e.task.Snapshot()
			totals := [2]int64{snap.Stdout.TotalBytes, snap.Stderr.TotalBytes}
			kept := [2]int64{e.keptLocked(0), e.keptLocked(1)}
			if !stdinChanged(e.status, e.task) && totals == e.rec.LastTotals && kept == e.sentKept {
				continue
			}
			applySnapshot(e.status, snap)
			e.setKeptLocked()
			e.rec.LastTotals, e.sentKept = totals, kept
			if err := s.store.write(uid, e.rec, e.status); err != nil {
				s.log.Error("recording progress", "uid", uid, "err", err)
			}
			s.broadcastLocked(taskEvent(agentv1.EventType_EVENT_TYPE_PROGRESS, e.status))
		}
		s.mu.Unlock()
	}
}

// readinessLoop re-evaluates readiness periodically and tells watchers when
// it changed.
func (s *Server) readinessLoop(ctx context.Context) {
	t := time.NewTicker(s.cfg.ReadinessInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		s.mu.Lock()
		if !s.stopping {
			s.updateReadinessLocked()
		}
		s.mu.Unlock()
	}
}

// updateReadinessLocked checks the shell (creating the executor when it was
// missing), the state directory and the certificates, sets the health
// service's status and sends a new AgentInfo to watchers on a change.
func (s *Server) updateReadinessLocked() {
	var problems []string
	if s.ex == nil {
		ex, err := executor.New(s.cfg.Executor)
		if err != nil {
			problems = append(problems, fmt.Sprintf("executor: %v", err))
		} else {
			s.ex = ex
			s.log.Info("executor ready", "shell", s.cfg.Executor.Shell, "mechanism", string(ex.Mechanism()),
				"cgroup", ex.CgroupPath(), "controllers", ex.Controllers(), "ambientEnv", string(ex.AmbientMode()),
				"isolation", string(ex.Isolation()), "shim", ex.ShimPath(), "capabilities", ex.Capabilities().Names(),
				"landlockABI", ex.Capabilities().LandlockABI)
			if why := ex.DiskQuotaProblem(); why != "" {
				s.log.Warn("tasks' working directories get no disk quota: a task can fill the node's disk", "reason", why)
			}
			if err := ex.EgressError(); err != nil {
				s.log.Warn("network Egress is not available: tasks asking for it are refused", "err", err)
				if s.cfg.TaskNetwork == executor.NetworkEgress {
					// Every task without spec.network would fail: no
					// other network is given in its place.
					problems = append(problems, fmt.Sprintf("--task-network=egress: %v", err))
				}
			}
		}
	}
	if s.ex != nil {
		if err := checkShell(s.cfg.Executor.Shell); err != nil {
			problems = append(problems, err.Error())
		}
	}
	if err := checkWritable(s.store.dir); err != nil {
		problems = append(problems, err.Error())
	}
	if s.cfg.CertCheck != nil {
		if err := s.cfg.CertCheck(time.Now()); err != nil {
			problems = append(problems, fmt.Sprintf("certificates: %v", err))
		}
	}
	changed := !slices.Equal(problems, s.problems)
	s.problems = problems
	s.updateHealthLocked()
	if changed {
		if len(problems) > 0 {
			s.log.Warn("agent not ready", "problems", problems)
		} else {
			s.log.Info("agent ready")
		}
		s.broadcastLocked(&agentv1.WatchResponse{Event: &agentv1.WatchResponse_Agent{Agent: s.agentInfoLocked()}})
	}
}

// checkShell reports a shell that disappeared after the executor was
// created (executor.New checked it once).
func checkShell(path string) error {
	st, err := os.Stat(path)
	if err != nil {
		return fmt.Errorf("shell %s: %w", path, err)
	}
	if !st.Mode().IsRegular() || st.Mode().Perm()&0o111 == 0 {
		return fmt.Errorf("shell %s is not an executable file", path)
	}
	return nil
}

func taskEvent(t agentv1.EventType, st *agentv1.TaskStatus) *agentv1.WatchResponse {
	return &agentv1.WatchResponse{Event: &agentv1.WatchResponse_Task{Task: &agentv1.TaskEvent{Type: t, Status: clone(st)}}}
}

func clone(st *agentv1.TaskStatus) *agentv1.TaskStatus { return proto.CloneOf(st) }
