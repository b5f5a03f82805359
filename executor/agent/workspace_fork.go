package agent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	agentv1 "github.com/bashtask/bashtask-operator/api/agent/v1"
	"github.com/bashtask/bashtask-operator/executor"
	"github.com/bashtask/bashtask-operator/executor/snapshot"
)

// forkSource is what a fork on this node copies: the source's executor
// workspace, its UID, and its carried state as of the fork's start.
type forkSource struct {
	ref   *agentv1.WorkspaceRef
	ex    *executor.Workspace
	uid   uint32
	carry carryState
	env   []executor.EnvVar
	// image says the source has a file system image of its own to copy.
	image bool
}

// forkLocked prepares a new workspace w that spec makes a fork of
// another (spec.fork_of). With restore_from set, the fork is restored
// from the source's snapshot: w only remembers whose. Otherwise the
// source must be held here, made and not being deleted: its state is
// taken for makeFork, and the fork gets the source's storage. Called
// with Server.mu held; the error is the RPC's.
func (ws *workspaces) forkLocked(w *workspace, spec *agentv1.WorkspaceSpec) error {
	of := spec.GetForkOf()
	if of == nil {
		return nil
	}
	if of.GetUid() == "" || of.GetUid() == w.rec.UID {
		return status.Errorf(codes.InvalidArgument, "spec.fork_of.uid %q must name another workspace", of.GetUid())
	}
	if w.restoreFrom != nil {
		w.rec.ForkedFrom = &agentv1.WorkspaceFork{Source: of, Method: "Snapshot", Time: w.restoreFrom.GetTime()}
		return nil
	}
	src := ws.byUID[of.GetUid()]
	switch {
	case src == nil || src.gone:
		return status.Errorf(codes.FailedPrecondition, "spec.fork_of: workspace %s is not held by this agent", of.GetUid())
	case src.rec.Deleting:
		return status.Errorf(codes.FailedPrecondition, "spec.fork_of: workspace %s is being deleted", of.GetUid())
	case src.busy != nil || src.ex == nil:
		return status.Errorf(codes.FailedPrecondition, "spec.fork_of: workspace %s is not ready on this agent (being made, or not taken up)", of.GetUid())
	}
	r := src.rec
	w.forkFrom = &forkSource{
		ref: &agentv1.WorkspaceRef{Namespace: r.Namespace, Name: r.Name, Uid: r.UID, Epoch: r.Epoch},
		ex:  src.ex, uid: r.TaskUID, env: slices.Clone(src.env), image: r.StorageEnforced,
		carry: carryState{
			CarriedDir: r.CarriedDir, CarryMessage: r.CarryMessage, CarryEnvNames: slices.Clone(r.CarryEnvNames),
			LastTaskEnd: r.LastTaskEnd, LastTaskName: r.LastTaskName, LastTaskUID: r.LastTaskUID,
		},
	}
	// The copy is the source's file system: its size comes with it.
	w.rec.StorageBytes, w.rec.StorageEnforced = r.StorageBytes, r.StorageEnforced
	return nil
}

// makeFork makes the new workspace w as a copy of w.forkFrom on this
// node: the source's image copied while frozen and mounted as w's (or,
// for a source without an image, its tree archived into w's), every
// entry of the source's UID given to w's, and the carried state taken.
// On failure it takes back what it made.
func (ws *workspaces) makeFork(ctx context.Context, ex *executor.Executor, w *workspace) (*executor.Workspace, error) {
	uid, src := w.rec.UID, w.forkFrom
	fork := &agentv1.WorkspaceFork{Source: src.ref}
	if src.image {
		st, err := src.ex.CopyImageFrozen(ws.files.path(uid, workspaceImageFile))
		if err != nil {
			_ = ws.files.remove(uid)
			return nil, status.Errorf(codes.Internal, "forking workspace %s: %v", src.ref.GetUid(), err)
		}
		fork.Method, fork.Time = string(st.Method), timestamppb.New(st.Time)
		fork.FrozenMicroseconds, fork.CopiedBytes = st.Frozen.Microseconds(), st.CopiedBytes
	}
	xw, err := ex.OpenWorkspace(ws.options(w))
	if err != nil {
		_ = ws.files.remove(uid)
		return nil, err
	}
	if err := ws.fillFork(ctx, w, xw, fork); err != nil {
		_ = xw.Remove()
		_ = ws.files.remove(uid)
		return nil, status.Errorf(codes.Internal, "forking workspace %s: %v", src.ref.GetUid(), err)
	}
	ws.s.log.Info("workspace forked", "workspace", uid, "source", src.ref.GetUid(), "method", fork.Method,
		"frozen", time.Duration(fork.FrozenMicroseconds)*time.Microsecond, "copiedBytes", fork.CopiedBytes)
	return xw, nil
}

// fillFork completes the fork xw: the source's tree archived into it when
// no image was copied, the source's UID's entries given to xw's, and the
// carried state, as a restore takes it. w is busy: nothing else touches
// its record.
func (ws *workspaces) fillFork(ctx context.Context, w *workspace, xw *executor.Workspace, fork *agentv1.WorkspaceFork) error {
	src := w.forkFrom
	if fork.Method == "" {
		fork.Method, fork.Time = "Archive", timestamppb.Now()
		if err := archiveInto(ctx, src.ex, xw); err != nil {
			return err
		}
	} else if err := xw.Adopt(src.uid, src.uid); err != nil {
		return err
	}
	r := w.rec
	c := src.carry
	r.CarriedDir, r.CarryMessage = c.CarriedDir, c.CarryMessage
	r.LastTaskEnd, r.LastTaskName, r.LastTaskUID = c.LastTaskEnd, c.LastTaskName, c.LastTaskUID
	if r.CarryEnv && len(src.env) > 0 {
		if err := ws.files.writeEnv(r.UID, src.env, r.TaskUID); err != nil {
			return fmt.Errorf("the carried variables: %w", err)
		}
		w.env, r.CarryEnvNames = src.env, c.CarryEnvNames
	}
	r.ForkedFrom = fork
	return nil
}

// archiveInto copies src's tree into the empty dst through the snapshot
// format, on the node and without a bucket: the path of a source without
// a file system image to copy. Files written meanwhile are from some
// moment during the copy, as in a snapshot.
func archiveInto(ctx context.Context, src, dst *executor.Workspace) error {
	pr, pw := io.Pipe()
	done := make(chan error, 1)
	go func() {
		_, err := src.Snapshot(ctx, pw, nil)
		pw.CloseWithError(err)
		done <- err
	}()
	_, err := dst.Restore(ctx, pr, func(snapshot.StateFile) error { return nil })
	_ = pr.CloseWithError(errors.New("restore ended"))
	return errors.Join(err, <-done)
}
