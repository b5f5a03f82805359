package agent

import (
	"context"
	"fmt"
	"os"
	"slices"
	"time"

	agentv1 "github.com/bashtask/bashtask-operator/api/agent/v1"
	"github.com/bashtask/bashtask-operator/executor"
)

func (s *Server) agentInfoLocked() *agentv1.AgentInfo {
	ready, problems := s.readinessLocked()
	r := &agentv1.Readiness{
		Ready:      ready,
		Problems:   problems,
		AmbientEnv: string(cmpOr(s.cfg.Executor.AmbientEnv, executor.DefaultAmbientMode(s.cfg.Executor.Isolation))),
		Shell:      s.cfg.Executor.Shell,
		Draining:   s.draining,
	}
	r.Isolation = string(cmpOr(s.cfg.Executor.Isolation, executor.IsolationProcess))
	r.TaskNetwork = apiNetwork(cmpOr(s.cfg.TaskNetwork, executor.NetworkNode))
	r.AllowedNetworks = s.allowedNetworkNames()
	if s.ex != nil {
		r.AmbientEnv = string(s.ex.AmbientMode())
		r.Mechanism = string(s.ex.Mechanism())
		r.CgroupControllers = s.ex.Controllers()
		caps := s.ex.Capabilities()
		r.Capabilities = caps.Names()
		r.Capabilities = append(r.Capabilities, s.ws.capabilitiesLocked()...)
		if s.images.store != nil {
			r.Capabilities = append(r.Capabilities, "images")
			if executor.UserNamespaces() == nil {
				r.Capabilities = append(r.Capabilities, "root-inside")
			}
		}
		r.LandlockAbi = int32(caps.LandlockABI)
		r.DiskCapBytes = s.ex.DiskCap()
		r.EnforcedLimits = enforcedLimits(s.ex)
	}
	return &agentv1.AgentInfo{
		NodeName:         s.cfg.NodeName,
		PodName:          s.cfg.PodName,
		IncarnationId:    s.incarnation,
		Capacity:         int32(s.cfg.MaxConcurrent),
		Running:          int32(s.running),
		Readiness:        r,
		ArgEnvLimitBytes: executor.CurrentArgEnvLimit(),
		MaxRequestBytes:  agentv1.MaxRequestBytes,
		Fence:            s.fence.current(),
	}
}

// readinessLoop re-evaluates readiness periodically and tells watchers when
// it changed.
func (s *Server) readinessLoop(ctx context.Context) {
	t := time.NewTicker(s.cfg.ReadinessInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		s.mu.Lock()
		if !s.stopping {
			s.updateReadinessLocked()
		}
		s.mu.Unlock()
	}
}

// updateReadinessLocked checks the shell (creating the executor when it was
// missing), the state directory and the certificates, sets the health
// service's status and sends a new AgentInfo to watchers on a change.
func (s *Server) updateReadinessLocked() {
	var problems []string
	if s.ex == nil {
		ex, err := executor.New(s.cfg.Executor)
		if err != nil {
			problems = append(problems, fmt.Sprintf("executor: %v", err))
		} else {
			s.ex = ex
			s.log.Info("executor ready", "shell", s.cfg.Executor.Shell, "mechanism", string(ex.Mechanism()),
				"cgroup", ex.CgroupPath(), "controllers", ex.Controllers(), "ambientEnv", string(ex.AmbientMode()),
				"isolation", string(ex.Isolation()), "shim", ex.ShimPath(), "capabilities", ex.Capabilities().Names(),
				"landlockABI", ex.Capabilities().LandlockABI, "enforcedLimits", enforcedLimits(ex))
			if why := ex.DiskQuotaProblem(); why != "" {
				s.log.Warn("tasks' working directories get no disk quota: a task can fill the node's disk", "reason", why)
			}
			if err := ex.EgressError(); err != nil {
				s.log.Warn("network Egress is not available: tasks asking for it are refused", "err", err)
				if s.cfg.TaskNetwork == executor.NetworkEgress {
					// Every task without spec.network would fail: no
					// other network is given in its place.
					problems = append(problems, fmt.Sprintf("--task-network=egress: %v", err))
				}
			}
		}
	}
	if s.ex != nil {
		if err := checkShell(s.cfg.Executor.Shell); err != nil {
			problems = append(problems, err.Error())
		}
	}
	if err := checkWritable(s.store.dir); err != nil {
		problems = append(problems, err.Error())
	}
	if s.cfg.CertCheck != nil {
		if err := s.cfg.CertCheck(time.Now()); err != nil {
			problems = append(problems, fmt.Sprintf("certificates: %v", err))
		}
	}
	changed := !slices.Equal(problems, s.problems)
	s.problems = problems
	s.updateHealthLocked()
	if changed {
		if len(problems) > 0 {
			s.log.Warn("agent not ready", "problems", problems)
		} else {
			s.log.Info("agent ready")
		}
		s.broadcastLocked(&agentv1.WatchResponse{Event: &agentv1.WatchResponse_Agent{Agent: s.agentInfoLocked()}})
	}
}

// checkShell reports a shell that disappeared after the executor was
// created (executor.New checked it once).
func checkShell(path string) error {
	st, err := os.Stat(path)
	if err != nil {
		return fmt.Errorf("shell %s: %w", path, err)
	}
	if !st.Mode().IsRegular() || st.Mode().Perm()&0o111 == 0 {
		return fmt.Errorf("shell %s is not an executable file", path)
	}
	return nil
}
