package main

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/util/uuid"
	coordinationv1client "k8s.io/client-go/kubernetes/typed/coordination/v1"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/bashtask/bashtask-operator/agentpool"
)

// leaderElectionID is the name of the leader-election Lease.
const leaderElectionID = "bashtask-controller.bashtask.dev"

// inClusterNamespaceFile names the namespace a pod runs in.
const inClusterNamespaceFile = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"

// leaderTimings are the leader-election durations, checked the way the
// elector checks them, so a bad combination fails at start with the flag
// names.
func (o *options) checkLeaderTimings() error {
	switch {
	case o.leaseDuration <= 0 || o.renewDeadline <= 0 || o.retryPeriod <= 0:
		return errors.New("--leader-election-lease-duration, --leader-election-renew-deadline and --leader-election-retry-period must be positive")
	case o.leaseDuration <= o.renewDeadline:
		return fmt.Errorf("--leader-election-lease-duration (%s) must be longer than --leader-election-renew-deadline (%s): the difference is the margin in which a leader that stopped renewing has stopped acting before another can lead", o.leaseDuration, o.renewDeadline)
	case float64(o.renewDeadline) <= 1.2*float64(o.retryPeriod):
		return fmt.Errorf("--leader-election-renew-deadline (%s) must be more than 1.2 × --leader-election-retry-period (%s)", o.renewDeadline, o.retryPeriod)
	}
	return nil
}

// newLeaderFence builds the Lease lock the manager's elector uses, wrapped
// in a LeaderFence, as controller-runtime would build the lock itself: a
// Lease named leaderElectionID in --leader-election-namespace (or the pod's
// namespace), held under the identity <hostname>_<uuid>, with a client
// timeout of half the renew deadline so one hung request cannot cost the
// lead.
func newLeaderFence(cfg *rest.Config, o *options) (*agentpool.LeaderFence, error) {
	ns := o.leaderElectionNamespace
	if ns == "" {
		raw, err := os.ReadFile(inClusterNamespaceFile)
		if err != nil {
			return nil, fmt.Errorf("finding the leader-election namespace: not in a pod (%w); set --leader-election-namespace", err)
		}
		ns = strings.TrimSpace(string(raw))
	}
	host, err := os.Hostname()
	if err != nil {
		return nil, fmt.Errorf("leader-election identity: %w", err)
	}
	id := host + "_" + string(uuid.NewUUID())
	cfg = rest.AddUserAgent(rest.CopyConfig(cfg), "leader-election")
	cfg.Timeout = max(o.renewDeadline/2, time.Second)
	core, err := corev1client.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	coord, err := coordinationv1client.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	lock, err := resourcelock.New(resourcelock.LeasesResourceLock, ns, leaderElectionID, core, coord,
		resourcelock.ResourceLockConfig{Identity: id})
	if err != nil {
		return nil, fmt.Errorf("creating the leader-election lock: %w", err)
	}
	return agentpool.NewLeaderFence(lock, o.renewDeadline, clock.RealClock{}, ctrl.Log.WithName("leader"))
}
