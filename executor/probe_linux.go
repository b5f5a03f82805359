//go:build linux

package executor

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/bashtask/bashtask-operator/executor/seccomp"
	"github.com/bashtask/bashtask-operator/executor/shim"
)

// probeTimeout bounds the probe task of the tenant level.
const probeTimeout = 30 * time.Second

// detectCapabilities fills e.caps. At IsolationTenant it runs a probe
// task through the shim with a network namespace of its own; its failure
// is an error wrapping ErrIsolation, since the level cannot be offered.
func (e *Executor) detectCapabilities() error {
	e.caps = Capabilities{
		LandlockABI: shim.LandlockABI(),
		Seccomp:     seccomp.Supported(),
		Cgroup:      e.cg != nil,
		Pids:        slices.Contains(e.Controllers(), "pids"),
	}
	if e.isolation != IsolationTenant {
		return nil
	}
	if !e.noSeccomp {
		if !e.caps.Seccomp {
			return fmt.Errorf("%w: the kernel has no seccomp filters", ErrIsolation)
		}
		// Assembled once here and handed to every shim in its Config.
		prog, err := seccomp.Assemble()
		if err != nil {
			return fmt.Errorf("%w: %w", ErrIsolation, err)
		}
		if e.seccompFilter, err = shim.EncodeFilter(prog); err != nil {
			return fmt.Errorf("%w: %w", ErrIsolation, err)
		}
	}
	task, err := e.Start(Spec{Command: "exit 0", Network: NetworkNone, Timeout: probeTimeout, SpillDir: "", TailBytes: 1024, SpillLimitBytes: 1})
	if err != nil {
		return fmt.Errorf("probing the tenant level: %w", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), probeTimeout+time.Minute)
	defer cancel()
	res, err := task.Wait(ctx)
	_ = removeAll(task.SpillDir())
	if err != nil || res.Reason != ReasonSucceeded {
		return fmt.Errorf("%w: probe task: %s %s", ErrIsolation, res.Reason, res.Message)
	}
	e.caps.Namespaces, e.caps.NetNS = true, true
	if e.egress != nil {
		// The veth pair, the addresses and the route are set up only for
		// a task: a probe finds a kernel without veth or a namespace
		// netlink refuses before a task does.
		if err := e.probe(NetworkEgress); err != nil {
			_ = e.egress.close()
			e.egress, e.egressErr = nil, fmt.Errorf("%w: egress: %w", ErrIsolation, err)
		}
	}
	e.caps.Egress = e.egress != nil
	return nil
}

// probe runs `exit 0` in network and says why it did not succeed.
func (e *Executor) probe(network Network) error {
	task, err := e.Start(Spec{Command: "exit 0", Network: network, Timeout: probeTimeout, SpillDir: "", TailBytes: 1024, SpillLimitBytes: 1})
	if err != nil {
		return fmt.Errorf("probe task: %w", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), probeTimeout+time.Minute)
	defer cancel()
	res, err := task.Wait(ctx)
	_ = removeAll(task.SpillDir())
	if err != nil || res.Reason != ReasonSucceeded {
		return fmt.Errorf("probe task: %s %s", res.Reason, res.Message)
	}
	return nil
}
