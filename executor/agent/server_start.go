package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	agentv1 "github.com/bashtask/bashtask-operator/api/agent/v1"
	"github.com/bashtask/bashtask-operator/api/v1alpha1"
	"github.com/bashtask/bashtask-operator/executor"
)

// Start implements the Start RPC in four steps, each a method of startOp:
// admit decides under the lock whether the task may start and takes its
// slot, record writes its record ahead of anything that runs, launch
// creates the process, and commit publishes the running task. A step that
// fails returns its error at once; the one deferred rollback then gives
// back what the steps before it took, so no step undoes anything itself.
func (s *Server) Start(ctx context.Context, req *agentv1.StartRequest) (resp *agentv1.StartResponse, err error) {
	op := &startOp{s: s, releaseFence: func() {}}
	defer func() {
		if err != nil {
			resp, err = op.rollback(err)
		}
		// Last: the fence is held until the start is done or undone.
		op.releaseFence()
	}()
	if resp, err = op.admit(ctx, req); resp != nil || err != nil {
		return resp, err
	}
	if err = op.record(); err != nil {
		return nil, err
	}
	if err = op.launch(); err != nil {
		return nil, err
	}
	return op.commit(), nil
}

// startOp is one Start call on its way through the steps. Its fields say
// how far it got, which is all rollback needs: e is set once admit took the
// slot, recorded once the record is on disk, task once the process runs.
type startOp struct {
	s            *Server
	releaseFence func() // ends the request's hold on the fence; never nil
	spec         *agentv1.TaskSpec
	uid          string
	log          *slog.Logger
	ex           *executor.Executor
	es           executor.Spec
	leased       *uint32 // the task's UID from the range, if it got one
	// rec and st are this call's own while it works outside the lock;
	// e, the table's entry, holds copies until commit or rollback.
	rec      *record
	st       *agentv1.TaskStatus
	e        *entry
	recorded bool
	task     *executor.Task
	// img is the task's image, held from admit on (a task without a
	// workspace); the entry holds it from admit's table entry on.
	img *imageAnswer
}

// admit is Start's first step: the fence, the spec's validity, then under
// the lock idempotency per UID, readiness, capacity and leftover files,
// with the slot taken and the UID entered in the table at once, so a
// concurrent Start of the same UID finds it and a concurrent one of
// another UID sees the slot gone. It returns the answer to a Start of a
// UID already known, or the refusal. The slow part, the record on disk
// and the executor creating directories, files and the process, runs
// outside the lock in the later steps: holding the agent's one lock
// across it would make every Start, finish and RPC of the node wait
// behind one fork.
func (op *startOp) admit(ctx context.Context, req *agentv1.StartRequest) (*agentv1.StartResponse, error) {
	s := op.s
	release, err := s.admitFence(ctx, "Start", req.GetFence())
	if err != nil {
		return nil, err
	}
	op.releaseFence = release
	spec := req.GetSpec()
	if err := validateSpec(spec); err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	digest, err := specDigest(spec)
	if err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	op.spec, op.uid = spec, spec.GetRef().GetUid()
	op.log = s.log.With("uid", op.uid, "namespace", spec.GetRef().GetNamespace(), "name", spec.GetRef().GetName())
	if resp, err := op.image(); resp != nil || err != nil {
		return resp, err
	}

	s.mu.Lock()
	defer s.mu.Unlock()
	if e, ok := s.tasks[op.uid]; ok {
		op.releaseImage() // the known task's own answers
		if e.status.GetSpecDigest() != digest {
			return nil, status.Errorf(codes.FailedPrecondition, "task %s is known with a different spec", op.uid)
		}
		return &agentv1.StartResponse{Status: clone(e.status), AlreadyKnown: true}, nil
	}
	needUID := s.leases != nil && spec.GetWorkspace() == nil
	if err := s.refuseStartLocked(op.uid, needUID); err != nil {
		return nil, err
	}
	if needUID {
		// Cannot fail: refuseStartLocked saw a free UID under this lock.
		u, _ := s.leases.acquire(op.uid)
		op.leased = &u
	}
	op.newRecordLocked(digest)
	// The table holds copies until the start is done.
	recCopy := *op.rec
	op.e = &entry{rec: &recCopy, status: clone(op.st), img: op.img.im}
	s.tasks[op.uid] = op.e
	s.running++
	s.metrics.Running.Set(float64(s.running))
	s.tasksWG.Add(1) // a shutdown waits for this start, then for the task
	return nil, nil
}

// image is admit's image step for a task without a workspace, before
// the task is in the table: the image held, or Start's answer while it
// is pulled (image_pull) or when its pull failed (image_failure), with
// nothing recorded, so that the same request starts the task later. A
// task of a workspace runs in the workspace's image and names none.
func (op *startOp) image() (*agentv1.StartResponse, error) {
	s, spec := op.s, op.spec
	op.img = &imageAnswer{}
	if spec.GetWorkspace() != nil {
		if spec.GetImage() != nil {
			return nil, status.Error(codes.InvalidArgument, "spec.image must be unset for a task of a workspace: it runs in the workspace's image")
		}
		return nil, nil
	}
	s.mu.Lock()
	_, known := s.tasks[op.uid]
	s.mu.Unlock()
	if known {
		return nil, nil // admit answers
	}
	a, err := s.images.request(spec.GetImage())
	switch {
	case err != nil:
		return nil, err
	case a.failure != nil:
		return &agentv1.StartResponse{ImageFailure: a.failure}, nil
	case a.pull != nil:
		return &agentv1.StartResponse{ImagePull: a.pull}, nil
	}
	op.img = a
	return nil, nil
}

// releaseImage lets go of the task's image while no entry holds it.
func (op *startOp) releaseImage() {
	if op.img != nil && op.img.im != nil {
		op.img.im.Release()
		op.img.im = nil
	}
}

// refuseStartLocked is admit's refusal of a new task, if any, in the order
// a caller should hear of it: the agent going away or not ready, its
// capacity, the task UID range (needUID) and files a task of this UID left.
// It takes nothing, so a refusal has nothing to give back.
func (s *Server) refuseStartLocked(uid string, needUID bool) error {
	switch {
	case s.stopping || s.draining:
		return status.Error(codes.Unavailable, "agent is shutting down")
	case s.ex == nil || len(s.problems) > 0:
		return status.Errorf(codes.Unavailable, "agent is not ready: %s", strings.Join(s.problems, "; "))
	case s.running >= s.cfg.MaxConcurrent:
		return status.Errorf(codes.ResourceExhausted, "agent runs its maximum of %d tasks", s.cfg.MaxConcurrent)
	case needUID && s.leases.full():
		return status.Errorf(codes.ResourceExhausted, "every UID of the task range %s is leased", s.leases.r)
	case s.store.exists(uid):
		// Files without a readable record: recovery logged why.
		// Running anything over them could mix two tasks' output.
		return status.Errorf(codes.FailedPrecondition, "task %s has leftover files in the state directory", uid)
	}
	return nil
}

// newRecordLocked fills in the executor's spec, the status and the record
// of an admitted task as they are before its process exists.
func (op *startOp) newRecordLocked(digest string) {
	s, spec := op.s, op.spec
	op.ex = s.ex
	op.es = s.toExecSpec(spec)
	if op.leased != nil {
		op.es.User = &executor.User{UID: *op.leased, GID: *op.leased}
	}
	if im := op.img.im; im != nil {
		// A private upper directory, the executor's, made and removed
		// with the task.
		op.es.Root = &executor.Root{Image: op.img.target.reference, LowerDirs: im.Layers, RootInside: op.img.target.rootInside}
	}
	op.st = &agentv1.TaskStatus{
		Ref:           proto.CloneOf(spec.GetRef()),
		State:         agentv1.TaskState_TASK_STATE_RUNNING,
		ExitCode:      -1,
		Mechanism:     string(op.ex.Mechanism()),
		IncarnationId: s.incarnation,
		SpecDigest:    digest,
		Image:         op.img.status(),
	}
	op.rec = &record{
		State:           stateStarting,
		Upload:          spec.GetOutput().GetUpload(),
		TailBytes:       cmpOr(op.es.TailBytes, executor.DefaultTailBytes),
		SpillLimitBytes: cmpOr(op.es.SpillLimitBytes, executor.DefaultSpillLimitBytes),
		Process:         processRecord{BootID: bootID(), TaskUID: op.leased},
	}
	if op.ex.Mechanism() == executor.MechanismCgroup {
		op.rec.Process.Cgroup = filepath.Join(op.ex.CgroupPath(), op.uid)
	}
}

// record is Start's second step: the write-ahead record, in state
// starting, before anything runs, so that recovery after a crash in the
// later steps finds the task and what it may have left.
func (op *startOp) record() error {
	if err := op.s.store.write(op.uid, op.rec, op.st); err != nil {
		return err
	}
	op.recorded = true
	return nil
}

// launch is Start's third step: the workspace binding or network check,
// the refusal of limits the node does not enforce, then the process, and what the task got noted in rec and st. Its error
// is the task's StartFailed: nothing of the command ran.
func (op *startOp) launch() error {
	s, spec := op.s, op.spec
	var err error
	if spec.GetWorkspace() != nil {
		// Its UID, network, directory and image are the workspace's.
		op.st.Image, err = s.ws.bindTask(op.uid, spec, &op.es)
	} else {
		err = s.networkError(spec)
	}
	if err == nil {
		err = s.limitsRefusal(op.ex, &op.es)
	}
	if err == nil {
		op.task, err = op.ex.Start(op.es)
	}
	if err != nil {
		return err
	}
	task, rec, st := op.task, op.rec, op.st
	rec.State = stateRunning
	if op.ex.Isolation() == executor.IsolationTenant {
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
	st.LimitsNotEnforced = task.LimitsNotEnforced()
	if op.es.WorkingDir == "" && op.es.Workspace == nil {
		rec.Process.WorkDir = task.WorkingDir()
	}
	st.WorkingDir, _ = task.StartDir()
	st.StartTime = timestamppb.Now()
	return nil
}

// commit is Start's last step, which cannot fail: the running record, then
// the entry published with its process, a Cancel or shutdown that came
// during the start applied, the STARTED event sent and the wait begun.
func (op *startOp) commit() *agentv1.StartResponse {
	s, rec, st, task := op.s, op.rec, op.st, op.task
	if err := s.store.write(op.uid, rec, st); err != nil {
		// The task runs; a later record write may succeed. Recovery still
		// finds it through its cgroup and environment.
		op.log.Error("recording started task", "err", err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	e := op.e
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
	op.log.Info("task started", "pid", rec.Process.PID)
	go s.waitTask(e)
	return &agentv1.StartResponse{Status: clone(st)}
}

// rollback is Start's one undo, run when a step failed with cause: it gives
// back what the steps before took, latest first, and turns cause into
// Start's answer. A refusal by admit took nothing and stays as it is. A
// record that could not be written means nothing ran: the task's files,
// table entry, UID and slot go, as if it had never been asked for, and the
// answer is an RPC error so the caller retries. A launch that failed leaves
// a recorded task whose command never ran: it finishes as StartFailed,
// which releases its UID and keeps its record for the caller to read, and
// the answer is that status, not an RPC error.
func (op *startOp) rollback(cause error) (*agentv1.StartResponse, error) {
	s := op.s
	if op.e == nil {
		op.releaseImage()
		return nil, cause
	}
	if !op.recorded {
		// Leave no directory that would block a retry.
		if err := s.store.remove(op.uid); err != nil {
			op.log.Error("removing the directory of a task that did not start", "err", err)
		}
	} else {
		op.log.Info("task did not start", "err", cause)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	// The slot: a shutdown no longer waits for this start.
	defer s.tasksWG.Done()
	s.running--
	s.metrics.Running.Set(float64(s.running))
	if !op.recorded {
		delete(s.tasks, op.uid)
		op.e.releaseImage()
		if op.leased != nil {
			s.leases.release(*op.leased) // nothing was started
		}
		return nil, status.Error(codes.Internal, cause.Error())
	}
	op.e.rec, op.e.status = op.rec, op.st
	res := executor.StartFailedResult(cause)
	if errors.Is(cause, executor.ErrImageShellMissing) {
		res.Reason = reasonImageShellMissing
	}
	s.finishLocked(op.e, res)
	return &agentv1.StartResponse{Status: clone(op.e.status)}, nil
}

// reasonImageShellMissing ends a task whose image has no bash (the
// executor's ErrImageShellMissing): the API's reason, not StartFailed.
const reasonImageShellMissing = executor.Reason(v1alpha1.ReasonImageShellMissing)

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
