package agent

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"gocloud.dev/blob"
	"gocloud.dev/gcerrors"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	agentv1 "github.com/bashtask/bashtask-operator/api/agent/v1"
	"github.com/bashtask/bashtask-operator/executor"
	"github.com/bashtask/bashtask-operator/executor/snapshot"
)

// Names of the state files a snapshot carries (snapshot.StatePrefix).
const (
	// snapshotCarryState is carryState as JSON.
	snapshotCarryState = "carry.json"
	// snapshotCarryEnv is the carried variables in the format of
	// workspaceEnvFile, mode 0600: readable by the workspace's owner
	// alone, in the archive too.
	snapshotCarryEnv = "carry-env"
)

// carryState is what of a workspace's record a snapshot carries: the
// carried directory and what the last task left, not the node's facts
// (UID, image, network namespace), which a restore makes anew.
type carryState struct {
	CarriedDir    string     `json:"carriedDir,omitempty"`
	CarryMessage  string     `json:"carryMessage,omitempty"`
	CarryEnvNames []string   `json:"carryEnvNames,omitempty"`
	LastTaskEnd   *time.Time `json:"lastTaskEnd,omitempty"`
	LastTaskName  string     `json:"lastTaskName,omitempty"`
	LastTaskUID   string     `json:"lastTaskUID,omitempty"`
}

// capabilitiesLocked are the readiness capabilities of the workspace
// side: "workspaces" once the agent can make them, and "snapshots" when
// SnapshotWorkspace and restore_from work through a bucket the operator
// named, which the other nodes' agents reach too (not the default
// directory in this node's state directory). Called with Server.mu held.
func (ws *workspaces) capabilitiesLocked() []string {
	if ws.readyLocked() != nil {
		return nil
	}
	if ws.s.bucket != nil && !ws.s.nodeLocalBucket {
		return []string{"workspaces", "snapshots"}
	}
	return []string{"workspaces"}
}

// SnapshotKey is the bucket key of a workspace's snapshot taken at epoch
// and time t: workspaces/<namespace>/<name>/<uid>/<epoch>-<unix ns>.tar.zst.
// Keys of one workspace sort by epoch, then time, within an epoch.
func SnapshotKey(ref *agentv1.WorkspaceRef, epoch int64, t time.Time) string {
	return agentv1.SnapshotKeyPrefix(ref) + fmt.Sprintf("%d-%d.tar.zst", epoch, t.UnixNano())
}

// SnapshotWorkspace implements the SnapshotWorkspace RPC.
func (ws *workspaces) SnapshotWorkspace(ctx context.Context, req *agentv1.SnapshotWorkspaceRequest) (*agentv1.SnapshotWorkspaceResponse, error) {
	s := ws.s
	if s.cfg.Executor.Isolation != executor.IsolationTenant {
		return nil, errNoTenant
	}
	release, err := s.admitFence(ctx, "SnapshotWorkspace", req.GetFence())
	if err != nil {
		return nil, err
	}
	defer release()
	if s.bucket == nil {
		return nil, status.Error(codes.FailedPrecondition, "this agent has no bucket (--output-bucket-url) to snapshot to")
	}
	uid := req.GetUid()
	s.mu.Lock()
	w := ws.byUID[uid]
	s.mu.Unlock()
	if w == nil {
		return nil, status.Errorf(codes.NotFound, "workspace %s is not held by this agent", uid)
	}
	// One snapshot of a workspace at a time; the table's lock is not held
	// meanwhile, so tasks start and end while the tree is read.
	select {
	case w.snapshotting <- struct{}{}:
		defer func() { <-w.snapshotting }()
	case <-ctx.Done():
		return nil, status.FromContextError(ctx.Err()).Err()
	}
	s.mu.Lock()
	switch {
	case w.gone || w.rec.Deleting:
		s.mu.Unlock()
		return nil, status.Errorf(codes.FailedPrecondition, "workspace %s is being deleted", uid)
	case w.busy != nil || w.ex == nil:
		s.mu.Unlock()
		return nil, status.Errorf(codes.FailedPrecondition, "workspace %s is not ready on this agent (being made, or not taken up)", uid)
	}
	began := time.Now().UTC()
	ref := &agentv1.WorkspaceRef{Namespace: w.rec.Namespace, Name: w.rec.Name, Uid: w.rec.UID}
	epoch := w.rec.Epoch
	state, err := snapshotState(w)
	xw, running, lastTask := w.ex, int32(len(w.tasks)), w.rec.LastTaskUID
	s.mu.Unlock()
	if err != nil {
		return nil, status.Errorf(codes.Internal, "workspace %s: its carried state: %v", uid, err)
	}

	key := SnapshotKey(ref, epoch, began)
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	bw, err := s.bucket.NewWriter(wctx, key, &blob.WriterOptions{ContentType: "application/zstd"})
	if err != nil {
		return nil, status.Errorf(codes.Unavailable, "workspace %s: opening %s in the bucket: %v", uid, key, err)
	}
	st, err := xw.Snapshot(wctx, bw, state)
	if err != nil {
		cancel() // before Close: the object is abandoned, not written
		_ = bw.Close()
		if ctx.Err() != nil {
			return nil, status.FromContextError(ctx.Err()).Err()
		}
		return nil, status.Errorf(codes.Unavailable, "workspace %s: %v", uid, err)
	}
	if err := bw.Close(); err != nil {
		return nil, status.Errorf(codes.Unavailable, "workspace %s: writing %s to the bucket: %v", uid, key, err)
	}
	snap := &agentv1.WorkspaceSnapshot{
		Url: s.bucketBase + "/" + key, Key: key,
		Bytes: st.ArchiveBytes, Sha256: st.ArchiveSHA256, DataBytes: st.DataBytes, Files: int64(st.Files),
		Time: timestamppb.New(began), Epoch: epoch, Changed: int32(len(st.Changed)),
		LastTaskUid: lastTask, RunningTasks: running,
	}
	s.log.Info("workspace snapshot written", "workspace", uid, "key", key, "bytes", st.ArchiveBytes,
		"dataBytes", st.DataBytes, "files", st.Files, "changed", len(st.Changed), "runningTasks", running,
		"took", time.Since(began).Round(time.Millisecond))
	return &agentv1.SnapshotWorkspaceResponse{Snapshot: snap}, nil
}

// snapshotState is w's carried state as the snapshot's state files.
// Called with Server.mu held.
func snapshotState(w *workspace) ([]snapshot.StateFile, error) {
	r := w.rec
	b, err := json.Marshal(carryState{
		CarriedDir: r.CarriedDir, CarryMessage: r.CarryMessage, CarryEnvNames: r.CarryEnvNames,
		LastTaskEnd: r.LastTaskEnd, LastTaskName: r.LastTaskName, LastTaskUID: r.LastTaskUID,
	})
	if err != nil {
		return nil, err
	}
	files := []snapshot.StateFile{{Name: snapshotCarryState, Mode: 0o600, Data: b}}
	if r.CarryEnv && len(w.env) > 0 {
		files = append(files, snapshot.StateFile{Name: snapshotCarryEnv, Mode: 0o600, Data: encodeEnv(w.env)})
	}
	return files, nil
}

// restore fills the new workspace w, made by the executor as xw, from the
// snapshot: the object read from the agent's bucket and checked against
// the snapshot's size and digest, its carried state taken into w's
// record. Called without Server.mu; w is busy, so nothing else touches
// its record.
func (ws *workspaces) restore(ctx context.Context, w *workspace, xw *executor.Workspace, from *agentv1.WorkspaceSnapshot) error {
	s := ws.s
	if s.bucket == nil {
		return status.Error(codes.FailedPrecondition, "this agent has no bucket (--output-bucket-url) to restore from")
	}
	key := from.GetKey()
	if want := s.bucketBase + "/" + key; key == "" || from.GetUrl() != want {
		return status.Errorf(codes.InvalidArgument, "spec.restore_from.url %q is not in this agent's bucket %s", from.GetUrl(), s.bucketBase)
	}
	// The record names the workspace being made: only its own snapshots
	// fill it, whatever the request says.
	ref := &agentv1.WorkspaceRef{Namespace: w.rec.Namespace, Name: w.rec.Name, Uid: w.rec.UID}
	if f := w.rec.ForkedFrom; f != nil {
		ref = f.GetSource() // a fork is filled from its source's snapshot
	}
	if err := agentv1.CheckSnapshotKey(ref, key); err != nil {
		return status.Errorf(codes.InvalidArgument, "spec.restore_from: %v; refusing to restore", err)
	}
	began := time.Now()
	br, err := s.bucket.NewReader(ctx, key, nil)
	if err != nil {
		code := codes.Unavailable
		if gcerrors.Code(err) == gcerrors.NotFound {
			code = codes.NotFound
		}
		return status.Errorf(code, "reading snapshot %s: %v", key, err)
	}
	defer br.Close()
	var carry carryState
	var env []executor.EnvVar
	st, err := xw.Restore(ctx, br, func(f snapshot.StateFile) error {
		switch f.Name {
		case snapshotCarryState:
			return json.Unmarshal(f.Data, &carry)
		case snapshotCarryEnv:
			env = decodeEnv(f.Data)
		}
		return nil // a state file of a later format: not this agent's to take
	})
	if err != nil {
		if errors.Is(err, snapshot.ErrFormat) {
			return status.Errorf(codes.DataLoss, "restoring from %s: %v", key, err)
		}
		return status.Errorf(codes.Internal, "restoring from %s: %v", key, err)
	}
	if st.ArchiveBytes != from.GetBytes() || !strings.EqualFold(st.ArchiveSHA256, from.GetSha256()) {
		return status.Errorf(codes.DataLoss, "snapshot %s is %d bytes with sha256 %s, the workspace's status names %d bytes with sha256 %s",
			key, st.ArchiveBytes, st.ArchiveSHA256, from.GetBytes(), from.GetSha256())
	}
	r := w.rec
	r.CarriedDir, r.CarryMessage = carry.CarriedDir, carry.CarryMessage
	r.LastTaskEnd, r.LastTaskName, r.LastTaskUID = carry.LastTaskEnd, carry.LastTaskName, carry.LastTaskUID
	r.CarryEnvNames = nil
	if r.CarryEnv && len(env) > 0 {
		env, _ = carriedEnv(env, nil) // the same rules as a task's end: the archive is not trusted more
		if err := ws.files.writeEnv(r.UID, env, r.TaskUID); err != nil {
			return status.Errorf(codes.Internal, "restoring the carried variables: %v", err)
		}
		w.env = env
		for _, v := range env {
			r.CarryEnvNames = append(r.CarryEnvNames, v.Name)
		}
	}
	if r.ForkedFrom == nil {
		r.RestoredFrom = from
	}
	s.log.Info("workspace restored", "workspace", r.UID, "key", key, "bytes", st.ArchiveBytes, "files", st.Files,
		"took", time.Since(began).Round(time.Millisecond))
	return nil
}

// encodeEnv is the format of workspaceEnvFile: NAME=VALUE entries, each
// ended by a NUL.
func encodeEnv(env []executor.EnvVar) []byte {
	var b bytes.Buffer
	for _, v := range env {
		b.WriteString(v.Name + "=" + v.Value)
		b.WriteByte(0)
	}
	return b.Bytes()
}

// decodeEnv reads encodeEnv's format.
func decodeEnv(b []byte) []executor.EnvVar {
	var out []executor.EnvVar
	for kv := range bytes.SplitSeq(b, []byte{0}) {
		if name, value, ok := bytes.Cut(kv, []byte{'='}); ok && len(name) > 0 {
			out = append(out, executor.EnvVar{Name: string(name), Value: string(value)})
		}
	}
	return out
}
