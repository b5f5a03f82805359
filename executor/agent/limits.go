package agent

import (
	"fmt"
	"slices"
	"strings"

	"github.com/bashtask/bashtask-operator/executor"
)

// UnenforcedPolicy says what the agent does with a task that asks for a
// resource limit its node does not enforce (--unenforced-limits).
type UnenforcedPolicy string

const (
	// UnenforcedWarn runs the task without the limit; its status names
	// the limit from its STARTED event on. The zero value means this.
	UnenforcedWarn UnenforcedPolicy = "warn"
	// UnenforcedRefuse ends the task StartFailed, naming the limits,
	// before anything of it runs.
	UnenforcedRefuse UnenforcedPolicy = "refuse"
)

// ParseUnenforcedPolicy converts a flag value; empty selects UnenforcedWarn.
func ParseUnenforcedPolicy(s string) (UnenforcedPolicy, error) {
	switch p := UnenforcedPolicy(s); p {
	case "":
		return UnenforcedWarn, nil
	case UnenforcedWarn, UnenforcedRefuse:
		return p, nil
	}
	return "", fmt.Errorf("--unenforced-limits %q: want warn or refuse", s)
}

// The limits of a task's spec.resources, in the executor's names (those
// of Result.LimitsNotEnforced and Readiness.enforced_limits).
const (
	limitMemory = "memory"
	limitCPU    = "cpu"
	limitPids   = "pids"
)

// enforcedLimits names the limits ex enforces for this agent's tasks: the
// cgroup controllers its task cgroups have, pids also at the tenant level
// (RLIMIT_NPROC on the task's own UID, which every task there has), and
// ephemeral-storage where fresh working directories get a disk quota.
func enforcedLimits(ex *executor.Executor) []string {
	var out []string
	controllers := ex.Controllers()
	for _, c := range []string{limitMemory, limitCPU, limitPids} {
		if slices.Contains(controllers, c) || (c == limitPids && ex.Isolation() == executor.IsolationTenant) {
			out = append(out, c)
		}
	}
	if ex.Capabilities().DiskQuota {
		out = append(out, executor.LimitEphemeralStorage)
	}
	return out
}

// requestedLimits names the limits es asks for.
func requestedLimits(es *executor.Spec) []string {
	var out []string
	for _, l := range []struct {
		name string
		set  bool
	}{
		{limitMemory, es.Limits.MemoryBytes > 0}, {limitCPU, es.Limits.CPUMillis > 0},
		{limitPids, es.Limits.Pids > 0}, {executor.LimitEphemeralStorage, es.Limits.DiskBytes > 0},
	} {
		if l.set {
			out = append(out, l.name)
		}
	}
	return out
}

// notEnforcedFor names the limits es asks for that ex does not enforce: a
// disk size for a working directory the spec names is never enforced,
// that directory not being a file system of its own.
func notEnforcedFor(ex *executor.Executor, es *executor.Spec) []string {
	enforced := enforcedLimits(ex)
	var out []string
	for _, l := range requestedLimits(es) {
		if !slices.Contains(enforced, l) || (l == executor.LimitEphemeralStorage && es.WorkingDir != "" && es.Workspace == nil) {
			out = append(out, l)
		}
	}
	return out
}

// limitsRefusal is the StartFailed cause of a task that asks for limits
// this node does not enforce, on an agent with --unenforced-limits=refuse;
// nil when the policy is warn or every limit is enforced.
func (s *Server) limitsRefusal(ex *executor.Executor, es *executor.Spec) error {
	if s.cfg.UnenforcedLimits != UnenforcedRefuse {
		return nil
	}
	missing := notEnforcedFor(ex, es)
	if len(missing) == 0 {
		return nil
	}
	return &executor.StartError{Kind: executor.ErrLimitsNotEnforced, Subject: fmt.Sprintf(
		"spec.resources asks for %s, which node %s does not enforce (it enforces %s); this agent refuses such tasks (--unenforced-limits=refuse)",
		strings.Join(missing, ", "), s.cfg.NodeName, orNone(enforcedLimits(ex)))}
}

// orNone joins names, or says "none".
func orNone(names []string) string {
	if len(names) == 0 {
		return "none"
	}
	return strings.Join(names, ", ")
}
