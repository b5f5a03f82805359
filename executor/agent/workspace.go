package agent

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	agentv1 "github.com/bashtask/bashtask-operator/api/agent/v1"
	"github.com/bashtask/bashtask-operator/executor"
	"github.com/bashtask/bashtask-operator/executor/image"
)

// DefaultMaxWorkspaces is the default of --max-workspaces: how many
// workspaces one agent holds at most.
const DefaultMaxWorkspaces = 1000

// workspaceLeaseKey is the key a workspace's UID lease is held under in
// the agent's table of leases, beside the task UIDs of task leases.
func workspaceLeaseKey(uid string) string { return "workspace/" + uid }

// errNoTenant is the refusal of every workspace call on an agent that
// runs tasks at the process level.
var errNoTenant = status.Error(codes.FailedPrecondition, "workspaces need the tenant isolation level (--isolation=tenant)")

// workspaces serves the Workspaces protocol (api/agent/v1/workspace.proto)
// for a Server and keeps its table of workspaces: what each is on disk
// (workspaceFiles), the executor's hold on it, and its running tasks.
// Its table is guarded by Server.mu; the slow work (a file system made or
// removed, a network namespace) runs outside it, on a workspace marked
// busy.
type workspaces struct {
	agentv1.UnimplementedWorkspacesServer

	s     *Server
	files workspaceFiles
	max   int

	byUID  map[string]*workspace
	taskWS map[string]*workspace // running task UID -> its workspace
	// refusalsMu guards each workspace's refusals, which its resolver's
	// goroutines write without s.mu.
	refusalsMu sync.Mutex
	// taskFresh are the managed variables' names each running task of a
	// workspace was started with: set anew for every task, they never
	// carry and the carry message does not name them.
	taskFresh map[string][]string
	// changed is closed and replaced whenever a workspace leaves the
	// table (changedLocked), which a draining agent waits for.
	changed chan struct{}
}

// workspace is one workspace of the table. Guarded by Server.mu.
type workspace struct {
	rec   *workspaceRecord
	env   []executor.EnvVar   // the carried variables (rec.CarryEnv)
	ex    *executor.Workspace // nil until taken up by the executor
	tasks map[string]bool     // UIDs of its running (or starting) tasks
	// busy is closed when the creation or deletion under way ends; nil
	// when none is.
	busy chan struct{}
	// gone is set once the workspace was removed or failed to be made.
	gone bool
	// idle is closed and replaced whenever the last running task ended.
	idle chan struct{}
	// snapshotting holds a token while a snapshot of the workspace is
	// taken (capacity 1): one at a time.
	snapshotting chan struct{}
	// restoreFrom is the snapshot a workspace being made is filled from.
	restoreFrom *agentv1.WorkspaceSnapshot
	// forkFrom is the source a workspace being made is copied from on
	// this node (workspace_fork.go); nil for none.
	forkFrom *forkSource
	// img holds the workspace's image (rec.Image) in the store while the
	// workspace is on the node; nil on the node's root, or when it could
	// not be acquired after a restart (its tasks then fail to start).
	img *image.Image
	// refusals are the names its egress policy refused most recently,
	// under workspaces.refusalsMu.
	refusals []*agentv1.EgressRefusal
	// egressApplied is set once the executor enforces rec.Egress.
	egressApplied bool
}

// newWorkspace returns a table entry for rec.
func newWorkspace(rec *workspaceRecord) *workspace {
	return &workspace{rec: rec, tasks: map[string]bool{}, idle: make(chan struct{}), snapshotting: make(chan struct{}, 1)}
}

// newWorkspaces reads the workspaces of the state directory and holds
// their UID leases, before any task lease is handed out. A record that
// cannot be read is logged and its workspace left alone (its UID stays
// unknown, so it is not held: the range should be checked by an operator).
func newWorkspaces(s *Server) (*workspaces, error) {
	ws := &workspaces{
		s:         s,
		files:     workspaceFiles{dir: filepath.Join(s.cfg.StateDir, "workspaces")},
		max:       cmpOr(s.cfg.MaxWorkspaces, DefaultMaxWorkspaces),
		byUID:     map[string]*workspace{},
		taskWS:    map[string]*workspace{},
		taskFresh: map[string][]string{},
		changed:   make(chan struct{}),
	}
	loaded, err := ws.files.load()
	if err != nil {
		return nil, err
	}
	for _, lw := range loaded {
		if lw.err != nil {
			s.log.Error("recovering workspace: unreadable record; leaving its files alone", "workspace", lw.uid, "err", lw.err)
			continue
		}
		w := newWorkspace(lw.rec)
		w.env = lw.env
		if s.leases != nil {
			s.leases.hold(lw.rec.TaskUID, workspaceLeaseKey(lw.uid))
		}
		ws.byUID[lw.uid] = w
	}
	if len(ws.byUID) > 0 {
		s.log.Info("recovered workspaces from the state directory", "workspaces", len(ws.byUID))
	}
	return ws, nil
}

// options are the executor's options of w.
func (ws *workspaces) options(w *workspace) executor.WorkspaceOptions {
	o := executor.WorkspaceOptions{
		ID:        w.rec.UID,
		SizeBytes: w.rec.StorageBytes,
		UID:       w.rec.TaskUID, GID: w.rec.TaskUID,
		Network: w.rec.Network,
	}
	if w.rec.StorageEnforced {
		// Never for a plain directory: a new, empty file system would
		// be mounted over its files.
		o.Image = ws.files.path(w.rec.UID, workspaceImageFile)
	}
	return o
}

// takeUp has the executor take up every recovered workspace: file
// systems mounted again where they are not, network namespaces made
// again (they went with the earlier incarnation), and deletions that an
// earlier incarnation began finished. It runs once the executor exists,
// before the agent serves.
func (ws *workspaces) takeUp(ctx context.Context) {
	s := ws.s
	s.mu.Lock()
	ex := s.ex
	var todo []*workspace
	for _, uid := range slices.Sorted(maps.Keys(ws.byUID)) {
		if w := ws.byUID[uid]; w.ex == nil {
			todo = append(todo, w)
		}
	}
	s.mu.Unlock()
	ws.acquireImages(todo)
	if ex == nil {
		return
	}
	for _, w := range todo {
		if w.rec.Deleting {
			if _, err := ws.delete(ctx, w.rec.UID); err != nil {
				s.log.Error("finishing the deletion of a workspace", "workspace", w.rec.UID, "err", err)
			}
			continue
		}
		o := ws.options(w)
		o.TakeOver = true
		xw, err := ex.OpenWorkspace(o)
		if err != nil {
			s.log.Error("taking up a workspace of an earlier incarnation", "workspace", w.rec.UID, "err", err)
			continue
		}
		if xw.ThawedAtOpen() {
			s.log.Warn("thawed a workspace's file system that an earlier incarnation left frozen (it stopped during a fork's copy)", "workspace", w.rec.UID)
		}
		s.mu.Lock()
		w.ex = xw
		if err := ws.applyEgress(w); err != nil {
			s.log.Error("applying a taken-up workspace's egress policy", "workspace", w.rec.UID, "err", err)
		} else {
			w.egressApplied = true
		}
		s.mu.Unlock()
	}
}

// ready checks that the agent can hold workspaces now; the error is the
// RPC's.
func (ws *workspaces) readyLocked() error {
	s := ws.s
	switch {
	case s.cfg.Executor.Isolation != executor.IsolationTenant:
		return errNoTenant
	case s.leases == nil:
		return status.Error(codes.FailedPrecondition, "workspaces need a UID of their own (--task-identity=leased)")
	case s.stopping:
		return status.Error(codes.Unavailable, "agent is shutting down")
	case s.ex == nil || len(s.problems) > 0:
		return status.Errorf(codes.Unavailable, "agent is not ready: %s", strings.Join(s.problems, "; "))
	}
	return nil
}

// EnsureWorkspace implements the EnsureWorkspace RPC.
func (ws *workspaces) EnsureWorkspace(ctx context.Context, req *agentv1.EnsureWorkspaceRequest) (*agentv1.EnsureWorkspaceResponse, error) {
	s := ws.s
	if s.cfg.Executor.Isolation != executor.IsolationTenant {
		return nil, errNoTenant
	}
	release, err := s.admitFence(ctx, "EnsureWorkspace", req.GetFence())
	if err != nil {
		return nil, err
	}
	defer release()
	spec := req.GetSpec()
	ref := spec.GetRef()
	if err := validateWorkspaceRef(ref); err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	uid := ref.GetUid()
	for {
		s.mu.Lock()
		if err := ws.readyLocked(); err != nil {
			s.mu.Unlock()
			return nil, err
		}
		w := ws.byUID[uid]
		if w != nil && w.busy != nil {
			busy := w.busy
			s.mu.Unlock()
			select {
			case <-busy:
				continue // made, or gone: look again
			case <-ctx.Done():
				return nil, status.FromContextError(ctx.Err()).Err()
			}
		}
		if w != nil {
			defer s.mu.Unlock()
			return ws.updateLocked(w, spec)
		}
		if s.draining {
			// It would only have to move again: the controller places it
			// elsewhere.
			s.mu.Unlock()
			return nil, status.Error(codes.Unavailable, "agent is shutting down: it makes no new workspace")
		}
		s.mu.Unlock()
		img, resp, err := ws.image(spec)
		if resp != nil || err != nil {
			return resp, err
		}
		s.mu.Lock()
		if w := ws.byUID[uid]; w != nil || ws.readyLocked() != nil || s.draining {
			s.mu.Unlock() // made meanwhile, or the agent changed: look again
			if img.im != nil {
				img.im.Release()
			}
			continue
		}
		return ws.createLocked(ctx, spec, img) // unlocks
	}
}

// image answers for the image of a workspace to make: held (or the
// node's root), or the EnsureWorkspace answer of its pull under way or
// failed.
func (ws *workspaces) image(spec *agentv1.WorkspaceSpec) (*imageAnswer, *agentv1.EnsureWorkspaceResponse, error) {
	a, err := ws.s.images.request(spec.GetImage())
	switch {
	case err != nil:
		return nil, nil, err
	case a.failure != nil:
		return nil, &agentv1.EnsureWorkspaceResponse{ImageFailure: a.failure}, nil
	case a.pull != nil:
		return nil, &agentv1.EnsureWorkspaceResponse{ImagePull: a.pull}, nil
	}
	return a, nil, nil
}

// imageDigests are the manifest digests of the recorded workspaces'
// images, which the image store holds from its opening on.
func (ws *workspaces) imageDigests() []string {
	var out []string
	for _, w := range ws.byUID {
		if im := w.rec.Image; im != nil && !w.rec.Deleting {
			out = append(out, im.ManifestDigest)
		}
	}
	return out
}

// acquireImages holds the images of workspaces taken up after a
// restart. One the store no longer has is logged: the workspace's tasks
// then fail to start, naming it, until the workspace is made again.
func (ws *workspaces) acquireImages(todo []*workspace) {
	s := ws.s
	for _, w := range todo {
		r := w.rec.Image
		if r == nil || w.rec.Deleting || s.images.store == nil {
			continue
		}
		im, err := s.images.store.Acquire(r.ManifestDigest)
		if err != nil {
			s.log.Error("holding a workspace's image after a restart", "workspace", w.rec.UID, "image", r.Reference, "digest", r.Digest, "err", err)
			continue
		}
		im.Digest = r.Digest
		s.mu.Lock()
		w.img = im
		s.mu.Unlock()
	}
}

// imageMismatch is the FAILED_PRECONDITION of an EnsureWorkspace whose
// image differs from the workspace's, naming both; nil when they match.
// A request naming no image matches a workspace made without a name.
func imageMismatch(r *workspaceRecord, spec *agentv1.ImageSpec) error {
	have := "the node's root file system"
	if r.Image != nil {
		have = fmt.Sprintf("image %s (digest %s)", r.Image.Reference, r.Image.Digest)
	}
	var want string
	switch {
	case spec.GetNodeRoot():
		if r.Image == nil {
			return nil
		}
		want = "the node's root file system"
	case spec.GetReference() == "":
		if !r.ImageNamed {
			return nil
		}
		want = "no image (the agent's default)"
	default:
		if r.Image != nil && r.ImageNamed && r.Image.Reference == spec.GetReference() && (spec.GetDigest() == "" || spec.GetDigest() == r.Image.Digest) {
			return rootInsideMismatch(r, spec)
		}
		want = "image " + spec.GetReference()
		if spec.GetDigest() != "" {
			want += " (digest " + spec.GetDigest() + ")"
		}
	}
	return status.Errorf(codes.FailedPrecondition, "workspace %s runs in %s, the request asks for %s: the image is immutable", r.UID, have, want)
}

// rootInsideMismatch is the FAILED_PRECONDITION of an EnsureWorkspace
// whose image.root_inside differs from the workspace's: what its tasks
// installed as root inside is owned accordingly, so it is fixed when the
// workspace is made.
func rootInsideMismatch(r *workspaceRecord, spec *agentv1.ImageSpec) error {
	if have := r.Image != nil && r.Image.RootInside; have != spec.GetRootInside() {
		return status.Errorf(codes.FailedPrecondition, "workspace %s runs with root inside %t, the request asks for %t: it is fixed when the workspace is made", r.UID, have, spec.GetRootInside())
	}
	return nil
}

// updateLocked answers an EnsureWorkspace of a known workspace: the same
// storage and network, new carry-over settings.
func (ws *workspaces) updateLocked(w *workspace, spec *agentv1.WorkspaceSpec) (*agentv1.EnsureWorkspaceResponse, error) {
	if w.rec.Deleting {
		return nil, status.Errorf(codes.FailedPrecondition, "workspace %s is being deleted", w.rec.UID)
	}
	if e := spec.GetRef().GetEpoch(); e != 0 && w.rec.Epoch != 0 && e != w.rec.Epoch {
		return nil, status.Errorf(codes.FailedPrecondition, "workspace %s: this agent holds its copy of epoch %d, the request is for epoch %d: delete the stale copy first",
			w.rec.UID, w.rec.Epoch, e)
	}
	if err := imageMismatch(w.rec, spec.GetImage()); err != nil {
		return nil, err
	}
	network, err := ws.network(spec.GetNetwork())
	if err != nil {
		return nil, err
	}
	if network != w.rec.Network {
		return nil, status.Errorf(codes.FailedPrecondition, "workspace %s has network %s, the request asks for %s: the network is immutable",
			w.rec.UID, apiNetwork(w.rec.Network), apiNetwork(network))
	}
	if size := ws.storage(spec.GetStorageBytes()); w.rec.StorageEnforced && size != w.rec.StorageBytes {
		return nil, status.Errorf(codes.FailedPrecondition, "workspace %s has storage of %d bytes, the request asks for %d: the storage is immutable",
			w.rec.UID, w.rec.StorageBytes, size)
	}
	if err := ws.updateEgressLocked(w, spec.GetEgress()); err != nil {
		return nil, err
	}
	if w.rec.CarryWorkingDir != spec.GetCarryWorkingDir() || w.rec.CarryEnv != spec.GetCarryEnv() || w.rec.Owner != spec.GetOwner() || w.rec.Pinned != spec.GetPinned() {
		w.rec.CarryWorkingDir, w.rec.CarryEnv, w.rec.Owner = spec.GetCarryWorkingDir(), spec.GetCarryEnv(), spec.GetOwner()
		w.rec.Pinned = spec.GetPinned()
		if !w.rec.CarryEnv && len(w.env) > 0 {
			// Switched off: the values go too, not only their use.
			w.env, w.rec.CarryEnvNames = nil, nil
			if err := os.Remove(ws.files.path(w.rec.UID, workspaceEnvFile)); err != nil && !errors.Is(err, os.ErrNotExist) {
				return nil, status.Error(codes.Internal, err.Error())
			}
		}
		if err := ws.files.writeRecord(w.rec, false); err != nil {
			return nil, status.Error(codes.Internal, err.Error())
		}
	}
	return &agentv1.EnsureWorkspaceResponse{Status: ws.statusLocked(w)}, nil
}

// network resolves a spec's network against the agent's rules: empty
// means --task-network; one not in --allowed-networks, Node where
// --task-network is none, and Egress where the agent cannot give it are
// INVALID_ARGUMENT.
func (ws *workspaces) network(name string) (executor.Network, error) {
	s := ws.s
	n := cmpOr(s.cfg.TaskNetwork, executor.NetworkNode)
	if name != "" {
		var ok bool
		if n, ok = execNetwork(name); !ok {
			return "", status.Errorf(codes.InvalidArgument, "spec.network %q is not Node, None or Egress", name)
		}
	}
	switch {
	case len(s.cfg.AllowedNetworks) > 0 && !slices.Contains(s.cfg.AllowedNetworks, n):
		return "", status.Errorf(codes.InvalidArgument, "spec.network %s is not allowed on this agent (--allowed-networks: %s)", apiNetwork(n), strings.Join(s.allowedNetworkNames(), ", "))
	case n == executor.NetworkNode && name != "" && s.cfg.TaskNetwork == executor.NetworkNone:
		return "", status.Error(codes.InvalidArgument, "spec.network Node: this agent gives tasks no network (--task-network=none)")
	case n == executor.NetworkEgress && s.ex != nil && !s.ex.Capabilities().Egress:
		why := "not configured"
		if err := s.ex.EgressError(); err != nil {
			why = err.Error()
		}
		return "", status.Errorf(codes.InvalidArgument, "spec.network Egress is not available on this agent: %s", why)
	}
	return n, nil
}

// storage is the size a workspace of requested bytes gets: the agent's
// default for 0; 0 where workspaces get no file system of their own.
func (ws *workspaces) storage(requested int64) int64 {
	s := ws.s
	if s.ex == nil || s.ex.DiskCap() == 0 {
		return 0
	}
	return cmpOr(requested, s.cfg.Executor.DiskQuotaBytes)
}

// createLocked makes a new workspace: the decisions under the lock (the
// limit, the network, the size, the UID lease, the table's entry marked
// busy), then, unlocked, its state directory and record, the executor's
// file system and network. It returns with Server.mu unlocked.
func (ws *workspaces) createLocked(ctx context.Context, spec *agentv1.WorkspaceSpec, img *imageAnswer) (*agentv1.EnsureWorkspaceResponse, error) {
	s := ws.s
	ref := spec.GetRef()
	uid := ref.GetUid()
	fail := func(err error) (*agentv1.EnsureWorkspaceResponse, error) {
		s.mu.Unlock()
		if img.im != nil {
			img.im.Release()
		}
		return nil, err
	}
	if len(ws.byUID) >= ws.max {
		return fail(status.Errorf(codes.ResourceExhausted, "agent holds its maximum of %d workspaces (--max-workspaces)", ws.max))
	}
	network, err := ws.network(spec.GetNetwork())
	if err != nil {
		return fail(err)
	}
	egress, err := egressPolicy(spec.GetEgress(), network)
	if err != nil {
		return fail(err)
	}
	size := ws.storage(spec.GetStorageBytes())
	if capBytes := s.ex.DiskCap(); capBytes > 0 && size > capBytes {
		return fail(status.Errorf(codes.InvalidArgument, "spec.storage_bytes %d is over the agent's cap of %d bytes (--task-disk-cap)", size, capBytes))
	}
	if size > 0 && size < executor.MinDiskQuotaBytes {
		return fail(status.Errorf(codes.InvalidArgument, "spec.storage_bytes %d is below the smallest workspace file system, %d bytes", size, executor.MinDiskQuotaBytes))
	}
	taskUID, ok := s.leases.acquire(workspaceLeaseKey(uid))
	if !ok {
		return fail(status.Errorf(codes.ResourceExhausted, "every UID of the task range %s is leased", s.leases.r))
	}
	rec := &workspaceRecord{
		Namespace: ref.GetNamespace(), Name: ref.GetName(), UID: uid, Owner: spec.GetOwner(),
		StorageBytes: size, StorageEnforced: size > 0, Network: network,
		CarryWorkingDir: spec.GetCarryWorkingDir(), CarryEnv: spec.GetCarryEnv(),
		TaskUID: taskUID, CreateTime: time.Now().UTC(), Epoch: ref.GetEpoch(), Pinned: spec.GetPinned(),
		Egress: egress,
	}
	rec.ImageNamed = spec.GetImage().GetNodeRoot() || spec.GetImage().GetReference() != ""
	if im := img.im; im != nil {
		rec.Image = &workspaceImage{Reference: img.target.reference, Digest: im.Digest, ManifestDigest: im.ManifestDigest, RootInside: img.target.rootInside}
	}
	w := newWorkspace(rec)
	w.busy, w.restoreFrom, w.img = make(chan struct{}), spec.GetRestoreFrom(), img.im
	if err := ws.forkLocked(w, spec); err != nil {
		s.leases.release(taskUID)
		return fail(err)
	}
	ws.byUID[uid] = w
	ex := s.ex
	s.mu.Unlock()

	xw, err := ws.make(ctx, ex, w)
	s.mu.Lock()
	defer s.mu.Unlock()
	close(w.busy)
	w.busy = nil
	if err != nil {
		w.gone = true
		delete(ws.byUID, uid)
		ws.changedLocked()
		if w.img != nil {
			w.img.Release()
			w.img = nil
		}
		s.leases.release(taskUID) // nothing of the UID ever ran
		if _, ok := status.FromError(err); ok {
			return nil, err // a restore's, with its code
		}
		code := codes.Internal
		if errors.Is(err, executor.ErrInvalidSpec) {
			code = codes.InvalidArgument
		}
		return nil, status.Errorf(code, "making workspace %s: %v", uid, err)
	}
	w.ex = xw
	if err := ws.applyEgress(w); err != nil {
		// Kept: the next EnsureWorkspace applies it again.
		s.log.Error("applying a new workspace's egress policy", "workspace", uid, "err", err)
		return nil, err
	}
	w.egressApplied = true
	rec.StorageEnforced = xw.StorageEnforced()
	if !rec.StorageEnforced {
		rec.StorageBytes = 0
	}
	if err := ws.files.writeRecord(rec, true); err != nil {
		s.log.Error("recording a new workspace", "workspace", uid, "err", err)
	}
	s.log.Info("workspace made", "workspace", uid, "namespace", rec.Namespace, "name", rec.Name,
		"taskUID", taskUID, "network", string(network), "storageBytes", rec.StorageBytes)
	return &agentv1.EnsureWorkspaceResponse{Status: ws.statusLocked(w), Created: true}, nil
}

// make writes a new workspace's record and has the executor make it; on
// failure it takes back what it made.
func (ws *workspaces) make(ctx context.Context, ex *executor.Executor, w *workspace) (*executor.Workspace, error) {
	uid := w.rec.UID
	if err := ws.files.create(uid); err != nil {
		return nil, err
	}
	// The record first, synced: a crash during the mkfs leaves a
	// workspace the next incarnation takes up (or deletes), not an
	// unknown image holding a leased UID's files.
	if err := ws.files.writeRecord(w.rec, true); err != nil {
		_ = ws.files.remove(uid)
		return nil, err
	}
	if w.forkFrom != nil {
		return ws.makeFork(ctx, ex, w)
	}
	xw, err := ex.OpenWorkspace(ws.options(w))
	if err != nil {
		_ = ws.files.remove(uid)
		return nil, err
	}
	if w.restoreFrom != nil {
		// Before the workspace is in the table as made: no task runs in
		// it while it fills.
		if err := ws.restore(ctx, w, xw, w.restoreFrom); err != nil {
			_ = xw.Remove()
			_ = ws.files.remove(uid)
			return nil, err
		}
	}
	return xw, nil
}

// GetWorkspace implements the GetWorkspace RPC.
func (ws *workspaces) GetWorkspace(_ context.Context, req *agentv1.GetWorkspaceRequest) (*agentv1.GetWorkspaceResponse, error) {
	s := ws.s
	if s.cfg.Executor.Isolation != executor.IsolationTenant {
		return nil, errNoTenant
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	w := ws.byUID[req.GetUid()]
	if w == nil || w.gone {
		return nil, status.Errorf(codes.NotFound, "workspace %s is not known", req.GetUid())
	}
	return &agentv1.GetWorkspaceResponse{Status: ws.statusLocked(w)}, nil
}

// ListWorkspaces implements the ListWorkspaces RPC.
func (ws *workspaces) ListWorkspaces(context.Context, *agentv1.ListWorkspacesRequest) (*agentv1.ListWorkspacesResponse, error) {
	s := ws.s
	if s.cfg.Executor.Isolation != executor.IsolationTenant {
		return nil, errNoTenant
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	resp := &agentv1.ListWorkspacesResponse{}
	for _, uid := range slices.Sorted(maps.Keys(ws.byUID)) {
		if w := ws.byUID[uid]; !w.gone {
			resp.Workspaces = append(resp.Workspaces, ws.statusLocked(w))
		}
	}
	return resp, nil
}

// statusLocked is w's state now. used_bytes is statfs of the root the
// executor holds open: no walk of what the tasks wrote.
func (ws *workspaces) statusLocked(w *workspace) *agentv1.WorkspaceStatus {
	r := w.rec
	st := &agentv1.WorkspaceStatus{
		Ref:             &agentv1.WorkspaceRef{Namespace: r.Namespace, Name: r.Name, Uid: r.UID, Epoch: r.Epoch},
		RunAsUser:       r.TaskUID,
		Path:            executor.WorkspaceHome,
		WorkingDir:      executor.WorkspaceHome,
		CarryMessage:    r.CarryMessage,
		CapacityBytes:   r.StorageBytes,
		StorageEnforced: r.StorageEnforced,
		RunningTasks:    int32(len(w.tasks)),
		Network:         apiNetwork(r.Network),
		CreateTime:      timestamppb.New(r.CreateTime),
		CarryEnvNames:   slices.Clone(r.CarryEnvNames),
		Epoch:           r.Epoch,
		RestoredFrom:    r.RestoredFrom,
		ForkedFrom:      r.ForkedFrom,
		Image:           workspaceImageStatus(w),
	}
	ws.refusalsMu.Lock()
	for _, x := range w.refusals {
		st.EgressRefusals = append(st.EgressRefusals, &agentv1.EgressRefusal{Name: x.GetName(), Count: x.GetCount(), LastUnixMillis: x.GetLastUnixMillis()})
	}
	ws.refusalsMu.Unlock()
	if r.CarryWorkingDir {
		st.WorkingDir = executor.WorkspaceView(r.CarriedDir)
	}
	if r.LastTaskEnd != nil {
		st.LastTaskEnd = timestamppb.New(*r.LastTaskEnd)
		st.LastTaskName, st.LastTaskUid = r.LastTaskName, r.LastTaskUID
	}
	if w.ex != nil {
		if used, err := w.ex.UsedBytes(); err == nil {
			st.UsedBytes = used
		}
	}
	return st
}

// workspaceImageStatus is w's image as its status reports it; nil on the
// node's root.
func workspaceImageStatus(w *workspace) *agentv1.ImageStatus {
	r := w.rec.Image
	if r == nil {
		return nil
	}
	return &agentv1.ImageStatus{Reference: r.Reference, Digest: r.Digest, Pulled: w.img != nil}
}

// DeleteWorkspace implements the DeleteWorkspace RPC.
func (ws *workspaces) DeleteWorkspace(ctx context.Context, req *agentv1.DeleteWorkspaceRequest) (*agentv1.DeleteWorkspaceResponse, error) {
	s := ws.s
	if s.cfg.Executor.Isolation != executor.IsolationTenant {
		return nil, errNoTenant
	}
	release, err := s.admitFence(ctx, "DeleteWorkspace", req.GetFence())
	if err != nil {
		return nil, err
	}
	defer release()
	n, err := ws.delete(ctx, req.GetUid())
	if err != nil {
		return nil, err
	}
	return &agentv1.DeleteWorkspaceResponse{CancelledTasks: int32(n)}, nil
}

// delete removes workspace uid: its running tasks cancelled (they end
// Cancelled through the normal path) and waited for, whatever is left of
// its UID killed, the executor's Remove (unmount, image, directory,
// network), its state directory, and its UID lease, released only when
// all of it is gone. It returns the number of tasks it cancelled.
func (ws *workspaces) delete(ctx context.Context, uid string) (int, error) {
	s := ws.s
	var w *workspace
	for {
		s.mu.Lock()
		w = ws.byUID[uid]
		if w == nil || w.gone {
			s.mu.Unlock()
			return 0, nil
		}
		if w.busy == nil {
			break
		}
		busy := w.busy
		s.mu.Unlock()
		select {
		case <-busy:
		case <-ctx.Done():
			return 0, status.FromContextError(ctx.Err()).Err()
		}
	}
	w.busy = make(chan struct{})
	defer func() {
		s.mu.Lock()
		close(w.busy)
		w.busy = nil
		s.mu.Unlock()
	}()
	if !w.rec.Deleting {
		w.rec.Deleting = true
		if err := ws.files.writeRecord(w.rec, true); err != nil {
			s.log.Error("recording a workspace's deletion", "workspace", uid, "err", err)
		}
	}
	cancelled := 0
	for tuid := range w.tasks {
		e := s.tasks[tuid]
		if e == nil || e.status.GetState() != agentv1.TaskState_TASK_STATE_RUNNING {
			continue
		}
		e.cancelled = true
		if e.task != nil {
			e.task.Cancel()
		}
		cancelled++
	}
	s.mu.Unlock()
	if cancelled > 0 {
		s.log.Info("stopping the running tasks of a workspace to delete it", "workspace", uid, "tasks", cancelled)
	}
	for {
		s.mu.Lock()
		n, idle := len(w.tasks), w.idle
		s.mu.Unlock()
		if n == 0 {
			break
		}
		select {
		case <-idle:
		case <-ctx.Done():
			return cancelled, status.FromContextError(ctx.Err()).Err()
		}
	}
	if err := ws.remove(w); err != nil {
		return cancelled, status.Errorf(codes.Internal, "removing workspace %s: %v", uid, err)
	}
	s.mu.Lock()
	w.gone = true
	delete(ws.byUID, uid)
	ws.changedLocked()
	if w.img != nil {
		w.img.Release() // the image may be evicted now
		w.img = nil
	}
	if s.leases != nil && s.leases.held[w.rec.TaskUID] == workspaceLeaseKey(uid) {
		s.leases.release(w.rec.TaskUID)
	}
	s.mu.Unlock()
	s.log.Info("workspace deleted", "workspace", uid, "cancelledTasks", cancelled)
	return cancelled, nil
}

// remove deletes what is left of w on the node once its tasks ended:
// every process of its UID killed, the executor's Remove, the state
// directory. Nothing here opens a path below the workspace's root.
func (ws *workspaces) remove(w *workspace) error {
	if err := killUID(w.rec.TaskUID); err != nil {
		return err
	}
	xw := w.ex
	if xw == nil {
		// Never taken up by this incarnation: take it up to remove it.
		s := ws.s
		s.mu.Lock()
		ex := s.ex
		s.mu.Unlock()
		if ex == nil {
			return errors.New("the executor is not ready")
		}
		o := ws.options(w)
		o.Network = executor.NetworkNode // nothing to reach: no namespace to make
		var err error
		if xw, err = ex.OpenWorkspace(o); err != nil {
			return err
		}
	}
	if err := xw.Remove(); err != nil {
		return err
	}
	return ws.files.remove(w.rec.UID)
}

// bindTask makes es, the spec of task uid, a task of the workspace the
// TaskSpec names: its executor workspace, start directory and carried
// state, and enters the task in the workspace's running tasks. The error
// is the task's StartFailed: a workspace the agent does not hold (or one
// being deleted, or whose image it no longer has), or a spec with a field
// a workspace task must not set. It returns the workspace's image as the
// task's status reports it.
func (ws *workspaces) bindTask(uid string, spec *agentv1.TaskSpec, es *executor.Spec) (*agentv1.ImageStatus, error) {
	s := ws.s
	ref := spec.GetWorkspace()
	invalid := func(msg string) error { return &executor.StartError{Kind: executor.ErrInvalidSpec, Subject: msg} }
	switch {
	case spec.GetNetwork() != "":
		return nil, invalid("spec.network must be unset for a task of a workspace: it runs in the workspace's network")
	case spec.GetResources().GetEphemeralStorageBytes() != 0:
		return nil, invalid("spec.resources.ephemeralStorage must be unset for a task of a workspace: it uses the workspace's storage")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	w := ws.byUID[ref.GetUid()]
	name := fmt.Sprintf("workspace %s/%s (uid %s)", ref.GetNamespace(), ref.GetName(), ref.GetUid())
	switch {
	case s.cfg.Executor.Isolation != executor.IsolationTenant:
		return nil, invalid("workspaces need the tenant isolation level (--isolation=tenant)")
	case w == nil || w.gone:
		return nil, invalid(name + " is not held by this agent")
	case w.rec.Deleting:
		return nil, invalid(name + " is being deleted")
	case w.ex == nil:
		return nil, invalid(name + " could not be taken up by this agent (see its log)")
	case ref.GetEpoch() != 0 && w.rec.Epoch != 0 && ref.GetEpoch() != w.rec.Epoch:
		return nil, invalid(fmt.Sprintf("%s: this agent's copy is of epoch %d, the task is for epoch %d: the workspace moved, and a stale copy runs no task",
			name, w.rec.Epoch, ref.GetEpoch()))
	}
	if err := ws.rootLocked(w, name, es); err != nil {
		return nil, err
	}
	wt := &executor.WorkspaceTask{Workspace: w.ex, Carry: w.rec.CarryWorkingDir, CarryEnv: w.rec.CarryEnv}
	switch {
	case spec.GetWorkingDir() != "":
		wt.Dir, wt.DirRequired = spec.GetWorkingDir(), true
	case w.rec.CarryWorkingDir:
		wt.Dir = w.rec.CarriedDir
	}
	if w.rec.CarryEnv {
		wt.Env = w.env
	}
	es.Workspace, es.WorkingDir, es.User = wt, "", nil
	w.tasks[uid] = true
	ws.taskWS[uid] = w
	fresh := make([]string, 0, len(es.ManagedEnv))
	for _, v := range es.ManagedEnv {
		fresh = append(fresh, v.Name)
	}
	ws.taskFresh[uid] = fresh
	return workspaceImageStatus(w), nil
}

// rootLocked gives es the workspace's image root: its image's layers and
// the upper and work directories on its file system, which last as long
// as it does (docs/images.md, "On the agent"). A workspace on the node's
// root has none.
func (ws *workspaces) rootLocked(w *workspace, name string, es *executor.Spec) error {
	r := w.rec.Image
	if r == nil {
		return nil
	}
	if w.img == nil {
		return &executor.StartError{Kind: executor.ErrInvalidSpec, Subject: fmt.Sprintf("%s: its image %s (digest %s) is no longer on this node", name, r.Reference, r.Digest)}
	}
	upper, work, err := w.ex.RootDirs()
	if err != nil {
		return &executor.StartError{Kind: executor.ErrProcessStart, Subject: "the workspace's image root", Cause: err}
	}
	es.Root = &executor.Root{Image: r.Reference, LowerDirs: w.img.Layers, UpperDir: upper, WorkDir: work, RootInside: r.RootInside}
	return nil
}

// taskEndedLocked takes a finished task out of its workspace's running
// tasks and keeps what its shell left (res.Carry) when it ended after the
// workspace's last task end: the directory relative to the root (one
// outside it does not carry), the variables less what never carries.
// Nothing recorded keeps the earlier state, and the message says why.
func (ws *workspaces) taskEndedLocked(uid, name string, res executor.Result) {
	w := ws.taskWS[uid]
	if w == nil {
		return
	}
	fresh := ws.taskFresh[uid]
	delete(ws.taskWS, uid)
	delete(ws.taskFresh, uid)
	delete(w.tasks, uid)
	if len(w.tasks) == 0 {
		close(w.idle)
		w.idle = make(chan struct{})
	}
	if res.StartTime.IsZero() || w.gone {
		return // it never ran
	}
	r := w.rec
	end := res.EndTime.UTC()
	if r.LastTaskEnd != nil && end.Before(*r.LastTaskEnd) {
		return // a later end won already
	}
	r.LastTaskEnd = &end
	r.LastTaskName, r.LastTaskUID = name, uid
	if c := res.Carry; c != nil {
		ws.applyCarryLocked(w, c, fresh)
	}
	if err := ws.files.writeRecord(r, false); err != nil {
		ws.s.log.Error("recording a workspace's carried state", "workspace", r.UID, "err", err)
	}
}

// applyCarryLocked keeps c, a recorded end state, as w's carried state.
// fresh are the managed names the task was started with. The carry
// message names what did not carry and why: the directory, and every
// exported variable dropped but the ones each task gets anew.
func (ws *workspaces) applyCarryLocked(w *workspace, c *executor.Carry, fresh []string) {
	r := w.rec
	if !c.Recorded {
		r.CarryMessage = "the last task's state did not carry over: " + c.Why
		return
	}
	var msgs []string
	if r.CarryWorkingDir {
		switch dir := c.Dir; {
		case dir == executor.WorkspaceHome:
			r.CarriedDir = ""
		case strings.HasPrefix(dir, executor.WorkspaceHome+"/"):
			r.CarriedDir = executor.WorkspaceDirIn(dir)
		default:
			msgs = append(msgs, fmt.Sprintf("the last task's shell ended in %s, outside the workspace: its directory does not carry over", dir))
		}
	}
	if r.CarryEnv {
		msgs = append(msgs, ws.carryEnvLocked(w, c.Env, fresh)...)
	}
	r.CarryMessage = strings.Join(msgs, "; ")
}

// carryEnvLocked keeps the variables of env that carry as w's and
// returns what the carry message says of them.
func (ws *workspaces) carryEnvLocked(w *workspace, env []executor.EnvVar, fresh []string) []string {
	r := w.rec
	env, dropped := carriedEnv(env, fresh)
	var msgs []string
	if m := droppedMessage(dropped); m != "" {
		msgs = append(msgs, m)
	}
	if err := ws.files.writeEnv(r.UID, env, r.TaskUID); err != nil {
		ws.s.log.Error("recording a workspace's carried variables", "workspace", r.UID, "err", err)
		return []string{"the last task's variables could not be recorded on the node"}
	}
	w.env = env
	r.CarryEnvNames = r.CarryEnvNames[:0]
	for _, v := range env {
		r.CarryEnvNames = append(r.CarryEnvNames, v.Name)
	}
	return msgs
}

// closeAll ends the executor's hold on every workspace (their network
// namespaces), leaving their files for the next incarnation.
func (ws *workspaces) closeAll() {
	s := ws.s
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, w := range ws.byUID {
		if w.ex != nil {
			_ = w.ex.Close()
		}
	}
}

// validateWorkspaceRef checks a workspace's reference, whose UID becomes
// a directory name.
func validateWorkspaceRef(ref *agentv1.WorkspaceRef) error {
	switch {
	case ref == nil:
		return errors.New("spec.ref is required")
	case !validUID.MatchString(ref.GetUid()):
		return fmt.Errorf("spec.ref.uid %q must be 1 to 128 letters, digits, '-', '_' or '.'", ref.GetUid())
	case !validObjectName(ref.GetNamespace()):
		return fmt.Errorf("spec.ref.namespace %q must be a non-empty name without '/'", ref.GetNamespace())
	case !validObjectName(ref.GetName()):
		return fmt.Errorf("spec.ref.name %q must be a non-empty name without '/'", ref.GetName())
	}
	return nil
}
