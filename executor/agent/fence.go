package agent

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	agentv1 "github.com/bashtask/bashtask-operator/api/agent/v1"
)

// fenceFile is the file in the state directory that holds the newest
// leader fence the agent has seen, so that a restarted agent still refuses
// an earlier leader.
const fenceFile = "fence.json"

// fencing admits requests by their leader fence (agentv1.Fence): a request
// from an epoch older than the newest seen is refused.
//
// Start and Cancel hold mu for reading while they act, and a newer epoch
// takes it for writing before it is recorded: once the request that
// carried a new epoch (normally the new leader's Watch) is admitted, no
// request of an older epoch is still at work in the agent, and none is
// admitted afterwards.
type fencing struct {
	path string
	mu   sync.RWMutex
	// newest is the newest fence seen; nil before any. Guarded by mu.
	newest *agentv1.Fence
}

// fenceRecord is fence.json.
type fenceRecord struct {
	Holder string `json:"holder"`
	Epoch  int64  `json:"epoch"`
}

// loadFencing reads the newest fence from stateDir; a missing file means
// none was seen yet.
func loadFencing(stateDir string) (*fencing, error) {
	f := &fencing{path: filepath.Join(stateDir, fenceFile)}
	raw, err := os.ReadFile(f.path)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return f, nil
	case err != nil:
		return nil, fmt.Errorf("reading the leader fence %s: %w", f.path, err)
	}
	var rec fenceRecord
	if err := json.Unmarshal(raw, &rec); err != nil {
		return nil, fmt.Errorf("the leader fence %s is damaged (remove it to accept any leader): %w", f.path, err)
	}
	f.newest = &agentv1.Fence{Holder: rec.Holder, Epoch: rec.Epoch}
	return f, nil
}

// current returns a copy of the newest fence, nil before any.
func (f *fencing) current() *agentv1.Fence {
	f.mu.RLock()
	defer f.mu.RUnlock()
	return proto.CloneOf(f.newest)
}

// errFenced builds the FAILED_PRECONDITION error of a refused request. The
// newest fence rides along as the status's detail, so that a controller
// that holds the Lease but whose epoch went back (a Lease deleted and
// created again) can raise its epoch above it.
func errFenced(rpc string, got, newest *agentv1.Fence) error {
	var msg string
	switch {
	case got == nil:
		msg = fmt.Sprintf("fenced: %s carries no leader fence, and this agent has seen leader epoch %d (holder %q); only the current leader may start or cancel tasks",
			rpc, newest.GetEpoch(), newest.GetHolder())
	case got.GetEpoch() == newest.GetEpoch():
		msg = fmt.Sprintf("fenced: %s comes from holder %q at leader epoch %d, but this agent has seen holder %q at the same epoch",
			rpc, got.GetHolder(), got.GetEpoch(), newest.GetHolder())
	default:
		msg = fmt.Sprintf("fenced: %s comes from leader epoch %d (holder %q), older than epoch %d (holder %q), the newest this agent has seen",
			rpc, got.GetEpoch(), got.GetHolder(), newest.GetEpoch(), newest.GetHolder())
	}
	st := status.New(codes.FailedPrecondition, msg)
	if withDetail, err := st.WithDetails(proto.CloneOf(newest)); err == nil {
		st = withDetail
	}
	return st.Err()
}

// admit decides on a request carrying got. On success it returns with mu
// held for reading and release unlocks it; the caller holds it while it
// acts. A newer epoch is written to the state directory (and synced)
// before anything is admitted under it. newEpoch reports a newer epoch
// recorded by this call.
func (f *fencing) admit(rpc string, got *agentv1.Fence) (release func(), newEpoch bool, err error) {
	f.mu.RLock()
	if refuse := f.refusal(rpc, got); refuse != nil || !f.newer(got) {
		if refuse != nil {
			f.mu.RUnlock()
			return nil, false, refuse
		}
		return f.mu.RUnlock, false, nil
	}
	f.mu.RUnlock()

	f.mu.Lock()
	if refuse := f.refusal(rpc, got); refuse != nil {
		f.mu.Unlock()
		return nil, false, refuse
	}
	if f.newer(got) {
		if err := f.persist(got); err != nil {
			f.mu.Unlock()
			return nil, false, status.Errorf(codes.Internal, "recording leader epoch %d: %v", got.GetEpoch(), err)
		}
		f.newest = proto.CloneOf(got)
		newEpoch = true
	}
	// Downgrade: requests of the new epoch may run concurrently.
	f.mu.Unlock()
	f.mu.RLock()
	if refuse := f.refusal(rpc, got); refuse != nil {
		// An even newer epoch arrived in between.
		f.mu.RUnlock()
		return nil, false, refuse
	}
	return f.mu.RUnlock, newEpoch, nil
}

// refusal returns the error for a request that must be refused, nil for one
// that may proceed. Called with mu held.
func (f *fencing) refusal(rpc string, got *agentv1.Fence) error {
	switch {
	case f.newest == nil:
		return nil
	case got == nil:
		return errFenced(rpc, got, f.newest)
	case got.GetEpoch() < f.newest.GetEpoch():
		return errFenced(rpc, got, f.newest)
	case got.GetEpoch() == f.newest.GetEpoch() && got.GetHolder() != f.newest.GetHolder():
		return errFenced(rpc, got, f.newest)
	}
	return nil
}

// newer reports whether got is newer than the newest fence. Called with mu
// held.
func (f *fencing) newer(got *agentv1.Fence) bool {
	return got != nil && (f.newest == nil || got.GetEpoch() > f.newest.GetEpoch())
}

// persist writes got to the fence file through a synced temporary file and
// a rename, so the file always holds a whole fence.
func (f *fencing) persist(got *agentv1.Fence) error {
	raw, err := json.Marshal(fenceRecord{Holder: got.GetHolder(), Epoch: got.GetEpoch()})
	if err != nil {
		return err
	}
	tmp := f.path + ".tmp"
	fh, err := os.OpenFile(tmp, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	if _, err := fh.Write(raw); err != nil {
		_ = fh.Close()
		return err
	}
	if err := fh.Sync(); err != nil {
		_ = fh.Close()
		return err
	}
	if err := fh.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp, f.path); err != nil {
		return err
	}
	if d, err := os.Open(filepath.Dir(f.path)); err == nil {
		_ = d.Sync()
		_ = d.Close()
	}
	return nil
}
