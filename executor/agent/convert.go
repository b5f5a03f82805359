package agent

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	agentv1 "github.com/bashtask/bashtask-operator/api/agent/v1"
	"github.com/bashtask/bashtask-operator/executor"
)

// ReasonAgentRestarted is the terminal reason of a task that was running
// when the agent process ended; the next incarnation stopped what was left
// of it (docs/agent.md, "Restarts").
const ReasonAgentRestarted = "AgentRestarted"

// Managed environment names the agent sets for every task, last so that
// nothing displaces them (docs/executor.md, "Environment").
const (
	EnvName      = executor.ManagedPrefix + "NAME"
	EnvNamespace = executor.ManagedPrefix + "NAMESPACE"
	EnvUID       = executor.ManagedPrefix + "UID"
	EnvNode      = executor.ManagedPrefix + "NODE"
)

// streamNames are the streams in the order of record.LastTotals.
var streamNames = [2]string{"stdout", "stderr"}

// toExecSpec translates a validated TaskSpec into an executor.Spec.
func (s *Server) toExecSpec(spec *agentv1.TaskSpec) executor.Spec {
	ref := spec.GetRef()
	es := executor.Spec{
		ID:              ref.GetUid(),
		Command:         spec.GetCommand(),
		WorkingDir:      spec.GetWorkingDir(),
		Timeout:         spec.GetTimeout().AsDuration(),
		KillGrace:       killGrace(spec),
		TailBytes:       int(spec.GetOutput().GetTailBytes()),
		SpillLimitBytes: spec.GetOutput().GetSpillLimitBytes(),
		SpillDir:        s.store.outputDir(ref.GetUid()),
		Limits: executor.Limits{
			MemoryBytes: spec.GetResources().GetMemoryBytes(),
			CPUMillis:   spec.GetResources().GetCpuMillis(),
			Pids:        spec.GetResources().GetPids(),
			DiskBytes:   spec.GetResources().GetEphemeralStorageBytes(),
		},
		User:    s.cfg.RunAs,
		Network: s.cfg.TaskNetwork,
	}
	if n, ok := execNetwork(spec.GetNetwork()); ok {
		es.Network = n
	}
	if p := spec.GetEgress(); p != nil {
		es.Egress = execEgress(p)
		es.EgressRefused = func(executor.EgressRefusal) {
			if s.metrics != nil {
				s.metrics.EgressRefusals.WithLabelValues("dns").Inc()
			}
		}
	}
	es.StdinStream = execStdinStream(spec.GetStdinStream())
	if spec.GetTty() {
		es.Terminal = &executor.TerminalSpec{Size: DefaultTerminalSize}
	}
	if in := spec.GetStdin(); in != nil {
		es.Stdin = append([]byte{}, in.GetData()...) // non-nil: a pipe, even when empty
	}
	for _, e := range spec.GetEnv() {
		es.Env = append(es.Env, executor.EnvVar{Name: e.GetName(), Value: e.GetValue()})
	}
	for _, e := range spec.GetManagedEnv() {
		es.ManagedEnv = append(es.ManagedEnv, executor.EnvVar{Name: e.GetName(), Value: e.GetValue()})
	}
	es.ManagedEnv = append(es.ManagedEnv,
		executor.EnvVar{Name: EnvName, Value: ref.GetName()},
		executor.EnvVar{Name: EnvNamespace, Value: ref.GetNamespace()},
		executor.EnvVar{Name: EnvUID, Value: ref.GetUid()},
		executor.EnvVar{Name: EnvNode, Value: s.cfg.NodeName},
	)
	return es
}

// killGrace is the executor's grace period for spec's kill_grace: absent
// is zero, the executor's DefaultKillGrace; a present zero is no grace
// period, executor.KillGraceNone (SIGKILL right after SIGTERM).
func killGrace(spec *agentv1.TaskSpec) time.Duration {
	g := spec.GetKillGrace()
	if g == nil {
		return 0
	}
	if d := g.AsDuration(); d != 0 {
		return d
	}
	return executor.KillGraceNone
}

// applyResult writes a finished task's Result into status.
func applyResult(status *agentv1.TaskStatus, r executor.Result) {
	status.State = agentv1.TaskState_TASK_STATE_FINISHED
	status.Reason = string(r.Reason)
	status.Message = r.Message
	status.ExitCode = int32(r.ExitCode)
	status.Signal = r.Signal
	if !r.StartTime.IsZero() {
		status.StartTime = timestamppb.New(r.StartTime)
	}
	if !r.EndTime.IsZero() {
		status.CompletionTime = timestamppb.New(r.EndTime)
	}
	status.LeftoverProcesses = int32(r.LeftoverProcesses)
	status.Mechanism = string(r.Mechanism)
	status.LimitsNotEnforced = append([]string(nil), r.LimitsNotEnforced...)
	status.Stdout = streamStatus(r.Stdout)
	status.Stderr = streamStatus(r.Stderr)
	status.Isolation = taskIsolation(r.Isolation)
	if r.StartDir != "" {
		status.WorkingDir = r.StartDir
	}
}

// taskIsolation is the protocol's form of iso, nil when iso says nothing
// (a task that did not start).
func taskIsolation(iso executor.IsolationResult) *agentv1.TaskIsolation {
	if iso.Level == "" {
		return nil
	}
	return &agentv1.TaskIsolation{
		Level:       string(iso.Level),
		User:        iso.UID,
		Namespaces:  append([]string(nil), iso.Namespaces...),
		LandlockAbi: int32(iso.LandlockABI),
		Seccomp:     iso.Seccomp,
		Network:     apiNetwork(iso.Network),
		PidsLimit:   iso.PidsLimit,
	}
}

func streamStatus(s executor.StreamResult) *agentv1.StreamStatus {
	ss := &agentv1.StreamStatus{
		Tail:       s.Tail,
		TotalBytes: s.TotalBytes,
		Truncated:  s.Truncated,
		Sanitized:  s.Sanitized,
		Sha256:     s.SHA256,
	}
	if s.SpillPath != "" {
		ss.Spill = &agentv1.Spill{Bytes: s.SpillBytes, Complete: s.SpillComplete}
	}
	return ss
}

// applySnapshot writes a running task's output so far into status.
func applySnapshot(status *agentv1.TaskStatus, snap executor.Snapshot) {
	for i, s := range []executor.StreamSnapshot{snap.Stdout, snap.Stderr} {
		ss := &agentv1.StreamStatus{Tail: s.Tail, TotalBytes: s.TotalBytes, Truncated: s.Truncated, Sanitized: s.Sanitized}
		if i == 0 {
			status.Stdout = ss
		} else {
			status.Stderr = ss
		}
	}
}

// recoverStream rebuilds a stream's status from its spill file after an
// agent restart; a missing file is an empty one. The file holds the bytes the earlier incarnation read
// before it died (what was still in the pipe is lost with it). The stream
// is known complete only when the file is shorter than the spill limit and
// not shorter than the last reported byte count; otherwise the checksum of
// the whole stream is unknown and left empty.
func recoverStream(path string, tailBytes int, spillLimit, lastTotal int64) (*agentv1.StreamStatus, error) {
	var f interface {
		io.Reader
		io.ReaderAt
	}
	switch sf, err := os.Open(path); {
	case os.IsNotExist(err):
		// The executor creates a spill file with the stream's first byte:
		// none means nothing was read.
		f = bytes.NewReader(nil)
	case err != nil:
		return nil, fmt.Errorf("reading spill file: %w", err)
	default:
		defer sf.Close()
		f = sf
	}
	h := sha256.New()
	size, err := io.Copy(h, f)
	if err != nil {
		return nil, fmt.Errorf("reading spill file %s: %w", path, err)
	}
	complete := size < spillLimit && size >= lastTotal
	ss := &agentv1.StreamStatus{
		TotalBytes: max(size, lastTotal),
		Spill:      &agentv1.Spill{Bytes: size, Complete: complete},
	}
	if complete {
		ss.Sha256 = hex.EncodeToString(h.Sum(nil))
	}
	// The executor's tail rule needs the last tailBytes bytes and whether
	// anything precedes them: one byte more says so.
	n := min(size, int64(max(tailBytes, 0))+1)
	buf := make([]byte, n)
	if _, err := f.ReadAt(buf, size-n); err != nil && !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("reading spill file %s: %w", path, err)
	}
	var truncated bool
	ss.Tail, ss.Sanitized, truncated = executor.TailOf(buf, tailBytes)
	// A spill file shorter than the stream holds only its beginning.
	ss.Truncated = truncated || size < ss.TotalBytes
	return ss, nil
}
