package agentpool

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	clocktesting "k8s.io/utils/clock/testing"

	agentv1 "github.com/bashtask/bashtask-operator/api/agent/v1"
)

// stubLock is a resourcelock.Interface whose writes succeed or fail on
// demand; the elector's use of a real Lease is covered by
// test/integration/fencing.
type stubLock struct {
	id      string
	fail    error
	written resourcelock.LeaderElectionRecord // the last record written
}

func (l *stubLock) Get(context.Context) (*resourcelock.LeaderElectionRecord, []byte, error) {
	return nil, nil, errors.New("not used")
}
func (l *stubLock) Create(_ context.Context, ler resourcelock.LeaderElectionRecord) error {
	l.written = ler
	return l.fail
}
func (l *stubLock) Update(_ context.Context, ler resourcelock.LeaderElectionRecord) error {
	l.written = ler
	return l.fail
}
func (l *stubLock) RecordEvent(string) {}
func (l *stubLock) Identity() string   { return l.id }
func (l *stubLock) Describe() string   { return "stub" }

func TestLeaderFence(t *testing.T) {
	const renew = 10 * time.Second
	clk := clocktesting.NewFakeClock(time.Unix(1000, 0))
	lock := &stubLock{id: "me"}
	f, err := NewLeaderFence(lock, renew, clk, logr.Discard())
	if err != nil {
		t.Fatal(err)
	}
	notLeader := func(what string) {
		t.Helper()
		if _, _, err := f.Fence(); !errors.Is(err, ErrNotLeader) {
			t.Errorf("%s: Fence() err = %v, want ErrNotLeader", what, err)
		}
	}
	notLeader("before the lease is acquired")

	ctx := t.Context()
	if err := f.Create(ctx, resourcelock.LeaderElectionRecord{HolderIdentity: "me", LeaderTransitions: 4}); err != nil {
		t.Fatal(err)
	}
	fence, until, err := f.Fence()
	if err != nil || fence.GetHolder() != "me" || fence.GetEpoch() != 4 || !until.Equal(clk.Now().Add(renew)) {
		t.Fatalf("after acquiring: fence %v until %v, err %v; want me at epoch 4 until +%s", fence, until, err, renew)
	}

	// A failed renewal does not extend the lead; it ends at the renew
	// deadline after the last successful one.
	clk.Step(6 * time.Second)
	lock.fail = errors.New("API server unreachable")
	_ = f.Update(ctx, resourcelock.LeaderElectionRecord{HolderIdentity: "me", LeaderTransitions: 4})
	if _, _, err := f.Fence(); err != nil {
		t.Errorf("6 s after the last renewal: %v", err)
	}
	clk.Step(4 * time.Second)
	notLeader("at the renew deadline after the last renewal")

	// A successful renewal brings it back, with the epoch written.
	lock.fail = nil
	if err := f.Update(ctx, resourcelock.LeaderElectionRecord{HolderIdentity: "me", LeaderTransitions: 6}); err != nil {
		t.Fatal(err)
	}
	if fence, _, err := f.Fence(); err != nil || fence.GetEpoch() != 6 {
		t.Errorf("after re-acquiring: fence %v, err %v; want epoch 6", fence, err)
	}

	// An agent that has seen a newer epoch than the Lease's (the Lease was
	// created again and counts from 0) makes the next renewal raise the
	// count above it, also when the elector writes its older view.
	noteFenced(f, fencedError(t, 9))
	if err := f.Update(ctx, resourcelock.LeaderElectionRecord{HolderIdentity: "me", LeaderTransitions: 6}); err != nil {
		t.Fatal(err)
	}
	if fence, _, err := f.Fence(); err != nil || fence.GetEpoch() != 10 || lock.written.LeaderTransitions != 10 {
		t.Errorf("after a refusal at epoch 9: fence %v (err %v), Lease written with %d transitions; want 10", fence, err, lock.written.LeaderTransitions)
	}
	// A refusal for an older epoch than ours raises nothing.
	noteFenced(f, fencedError(t, 3))
	_ = f.Update(ctx, resourcelock.LeaderElectionRecord{HolderIdentity: "me", LeaderTransitions: 10})
	if lock.written.LeaderTransitions != 10 {
		t.Errorf("a refusal at an older epoch changed the count to %d", lock.written.LeaderTransitions)
	}

	// A release (the record names no holder) ends the lead at once.
	if err := f.Update(ctx, resourcelock.LeaderElectionRecord{HolderIdentity: ""}); err != nil {
		t.Fatal(err)
	}
	notLeader("after a release")

	// fenceFor refuses and counts while not leading.
	if _, _, _, err := fenceFor(ctx, f, "Start"); !errors.Is(err, ErrNotLeader) {
		t.Errorf("fenceFor: %v, want ErrNotLeader", err)
	}
	// Without leader election, everything proceeds without a fence.
	if _, cancel, fence, err := fenceFor(ctx, nil, "Start"); err != nil || fence != nil {
		t.Errorf("fenceFor without a fencer: fence %v, err %v", fence, err)
	} else {
		cancel()
	}
}

// fencedError is an agent's refusal naming the newest epoch it has seen.
func fencedError(t *testing.T, epoch int64) error {
	t.Helper()
	st, err := status.New(codes.FailedPrecondition, "fenced").WithDetails(&agentv1.Fence{Holder: "other", Epoch: epoch})
	if err != nil {
		t.Fatal(err)
	}
	return st.Err()
}
