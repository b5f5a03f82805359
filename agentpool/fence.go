package agentpool

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	"k8s.io/utils/clock"

	agentv1 "github.com/bashtask/bashtask-operator/api/agent/v1"
)

// ErrNotLeader is wrapped by the errors of calls refused because this
// controller is no longer sure it holds the leader-election Lease: its
// last successful renewal is more than the renew deadline old (a process
// paused, an API server it cannot reach), or it never acquired the Lease.
// Such a controller starts, cancels and forgets nothing and writes no
// status: another one may lead already.
var ErrNotLeader = errors.New("not sure to lead: the leader-election lease was not renewed within the renew deadline")

// Fencer says whether this controller may act as the leader, and with
// which fence. LeaderFence implements it; nil (no leader election) means
// every call may proceed without a fence.
type Fencer interface {
	// Fence returns the fence to send with Start, Cancel and Watch and the
	// time until which this controller is sure it leads (on its monotonic
	// clock), or an error wrapping ErrNotLeader.
	Fence() (f *agentv1.Fence, validUntil time.Time, err error)
}

// LeaderFence is a resourcelock.Interface that wraps the leader-election
// lock controller-runtime's elector uses, and records each Lease write of
// this controller that made or kept it the holder: the holder identity,
// the Lease's leaseTransitions (the epoch: every change of holder raises
// it) and the time, on the local monotonic clock, at which that write was
// sent.
//
// It is sure it leads until that time plus the renew deadline. The elector
// gives up the lead when it could not renew for the renew deadline; another
// candidate can acquire the Lease only when the lease duration has passed
// since it last saw the record change, and that change came after the
// write was sent. So with RenewDeadline < LeaseDuration (the elector
// requires it) this controller stops acting LeaseDuration − RenewDeadline
// before anyone else can lead, whatever the elector's goroutines do after a
// pause: the check is made before every agent call and status write, not
// when the elector gets to run. The margin covers calls in flight and the
// drift between the clocks' rates.
type LeaderFence struct {
	inner         resourcelock.Interface
	renewDeadline time.Duration
	clock         clock.PassiveClock
	log           logr.Logger
	refused       *prometheus.CounterVec

	mu         sync.Mutex
	fence      *agentv1.Fence // nil while not holding
	validUntil time.Time
	// floor is the lowest leaseTransitions this controller writes as the
	// holder: one above the newest epoch an agent refused it for. Zero
	// until an agent refuses it.
	floor int64
}

// NewLeaderFence wraps inner, the Lease lock passed to the manager as
// LeaderElectionResourceLockInterface; renewDeadline must be the manager's
// RenewDeadline. clk must be monotonic (a real clock, or a fake one in
// tests). It returns an error for a nil lock or a non-positive deadline.
func NewLeaderFence(inner resourcelock.Interface, renewDeadline time.Duration, clk clock.PassiveClock, log logr.Logger) (*LeaderFence, error) {
	if inner == nil || renewDeadline <= 0 {
		return nil, errors.New("leader fence: a lock and a positive renew deadline are required")
	}
	if clk == nil {
		clk = clock.RealClock{}
	}
	return &LeaderFence{
		inner: inner, renewDeadline: renewDeadline, clock: clk, log: log,
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "bashtask_not_leader_refusals_total",
			Help: "Agent calls and status writes this controller did not make because it was no longer sure it led, by action.",
		}, []string{"action"}),
	}, nil
}

// Collector returns the fence's metric, bashtask_not_leader_refusals_total
// {action}: calls ("Start", "Cancel", "Forget", "Watch") and status writes
// ("status") not made because the controller was not sure it led.
func (f *LeaderFence) Collector() prometheus.Collector { return f.refused }

// Fence implements Fencer.
func (f *LeaderFence) Fence() (*agentv1.Fence, time.Time, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.fence == nil {
		return nil, time.Time{}, fmt.Errorf("%w (the lease is not held)", ErrNotLeader)
	}
	if now := f.clock.Now(); !now.Before(f.validUntil) {
		return nil, time.Time{}, fmt.Errorf("%w (epoch %d, last renewal sent %s ago, renew deadline %s)",
			ErrNotLeader, f.fence.GetEpoch(), now.Sub(f.validUntil.Add(-f.renewDeadline)).Round(time.Millisecond), f.renewDeadline)
	}
	return &agentv1.Fence{Holder: f.fence.GetHolder(), Epoch: f.fence.GetEpoch()}, f.validUntil, nil
}

// refuse counts an action not taken for lack of the lead.
func (f *LeaderFence) refuse(action string) { f.refused.WithLabelValues(action).Inc() }

// Get implements resourcelock.Interface.
func (f *LeaderFence) Get(ctx context.Context) (*resourcelock.LeaderElectionRecord, []byte, error) {
	return f.inner.Get(ctx)
}

// Create implements resourcelock.Interface.
func (f *LeaderFence) Create(ctx context.Context, ler resourcelock.LeaderElectionRecord) error {
	f.raiseEpoch(&ler)
	sent := f.clock.Now()
	err := f.inner.Create(ctx, ler)
	f.observe(ler, sent, err)
	return err
}

// Update implements resourcelock.Interface.
func (f *LeaderFence) Update(ctx context.Context, ler resourcelock.LeaderElectionRecord) error {
	f.raiseEpoch(&ler)
	sent := f.clock.Now()
	err := f.inner.Update(ctx, ler)
	f.observe(ler, sent, err)
	return err
}

// raiseEpoch lifts the transitions of a record this controller writes as
// the holder to the floor. Every write of the elector passes here, the
// renewals that copy its own older view of the count included, so the
// Lease keeps the raised count. Raising it is as safe as the count
// itself: the write succeeds only for the Lease's current holder, since
// Lease writes are conditional on its resourceVersion.
func (f *LeaderFence) raiseEpoch(ler *resourcelock.LeaderElectionRecord) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if ler.HolderIdentity == f.inner.Identity() && int64(ler.LeaderTransitions) < f.floor {
		ler.LeaderTransitions = int(f.floor)
	}
}

// refusedBy notes that an agent refused this controller's fence because it
// has seen newest. When this controller holds the Lease at a lower epoch,
// the Lease's count went back (it was deleted and created again, or moved
// to another namespace): its next renewal raises the count above newest,
// and its calls are accepted again. An earlier leader that is refused
// raises nothing: it no longer manages to write the Lease.
func (f *LeaderFence) refusedBy(newest *agentv1.Fence) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.fence == nil || newest.GetEpoch() < f.fence.GetEpoch() || newest.GetEpoch()+1 <= f.floor {
		return
	}
	f.floor = newest.GetEpoch() + 1
	f.log.Info("An agent has seen a newer leader epoch than the Lease's; raising the epoch at the next renewal",
		"epoch", f.fence.GetEpoch(), "agentEpoch", newest.GetEpoch(), "agentHolder", newest.GetHolder(), "newEpoch", f.floor)
}

// observe records a Lease write sent at sent. A failed write changes
// nothing: the lead, if held, lasts until its deadline. A successful write
// naming another holder (a release) ends the lead at once.
func (f *LeaderFence) observe(ler resourcelock.LeaderElectionRecord, sent time.Time, err error) {
	if err != nil {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if ler.HolderIdentity != f.inner.Identity() {
		f.fence = nil
		return
	}
	epoch := int64(ler.LeaderTransitions)
	if f.fence == nil || f.fence.GetEpoch() != epoch {
		f.log.Info("Leading", "holder", ler.HolderIdentity, "epoch", epoch)
	}
	f.fence = &agentv1.Fence{Holder: ler.HolderIdentity, Epoch: epoch}
	f.validUntil = sent.Add(f.renewDeadline)
}

// RecordEvent implements resourcelock.Interface.
func (f *LeaderFence) RecordEvent(s string) { f.inner.RecordEvent(s) }

// Identity implements resourcelock.Interface.
func (f *LeaderFence) Identity() string { return f.inner.Identity() }

// Describe implements resourcelock.Interface.
func (f *LeaderFence) Describe() string { return f.inner.Describe() }

// noteFenced passes the newest fence an agent refused a call for (the
// FAILED_PRECONDITION's detail) to fencer.
func noteFenced(fencer Fencer, err error) {
	lf, ok := fencer.(*LeaderFence)
	if !ok || status.Code(err) != codes.FailedPrecondition {
		return
	}
	for _, d := range status.Convert(err).Details() {
		if newest, ok := d.(*agentv1.Fence); ok {
			lf.refusedBy(newest)
		}
	}
}

// fenceFor returns the fence of a call (nil without leader election) and a
// context that ends when this controller stops being sure it leads, so a
// call that is slow to leave (a paused process) expires instead of arriving
// late. action names the call in the metric. The error wraps ErrNotLeader.
func fenceFor(ctx context.Context, fencer Fencer, action string) (context.Context, context.CancelFunc, *agentv1.Fence, error) {
	if fencer == nil {
		return ctx, func() {}, nil, nil
	}
	f, until, err := fencer.Fence()
	if err != nil {
		if lf, ok := fencer.(*LeaderFence); ok {
			lf.refuse(action)
		}
		return nil, nil, nil, err
	}
	cctx, cancel := context.WithDeadline(ctx, until)
	return cctx, cancel, f, nil
}

// Leading returns an error wrapping ErrNotLeader when fencer says this
// controller is not sure it leads; action names what it was about to do,
// for the metric.
func Leading(fencer Fencer, action string) error {
	_, cancel, _, err := fenceFor(context.Background(), fencer, action)
	if err != nil {
		return err
	}
	cancel()
	return nil
}
