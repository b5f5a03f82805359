package controllers

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	agentv1 "github.com/bashtask/bashtask-operator/api/agent/v1"
	bashtaskv1alpha1 "github.com/bashtask/bashtask-operator/api/v1alpha1"
)

// DefaultStatusBudgetBytes is the default --status-budget-bytes: the largest
// JSON encoding of a BashTask's status the controller writes (256 KiB). It
// keeps a task far below etcd's request limit (1.5 MiB by default) whatever
// the command printed.
const DefaultStatusBudgetBytes = 262144

// FitStatusBudget shortens the stdout and stderr tails of st from the front,
// at UTF-8 rune boundaries, until the JSON encoding of st is at most budget
// bytes. The longer tail is shortened first. A shortened stream is marked
// truncated. The size is measured on the encoding, not the raw bytes: a
// control byte such as \x01 becomes the six bytes \u0001, so binary output
// grows up to six-fold when escaped.
//
// It returns an error when the status is over budget even with both tails
// empty; callers treat that as a bug in the budget's configuration, since
// every other status field is bounded by the schema.
func FitStatusBudget(st *bashtaskv1alpha1.BashTaskStatus, budget int) error {
	for {
		raw, err := json.Marshal(st)
		if err != nil {
			return fmt.Errorf("encoding status to measure it: %w", err)
		}
		excess := len(raw) - budget
		if excess <= 0 {
			return nil
		}
		s := longerTail(st.Stdout, st.Stderr)
		if s == nil {
			return fmt.Errorf("status encodes to %d bytes without any output tail, over the budget of %d bytes", len(raw), budget)
		}
		tail := ptr.Deref(s.Tail, "")
		s.Tail = optional(tail[cutIndex(tail, excess):])
		s.Truncated = ptr.To(true)
	}
}

// longerTail returns the stream with the longer non-empty tail, or nil.
func longerTail(a, b *bashtaskv1alpha1.StreamStatus) *bashtaskv1alpha1.StreamStatus {
	var best *bashtaskv1alpha1.StreamStatus
	for _, s := range []*bashtaskv1alpha1.StreamStatus{a, b} {
		if s != nil && ptr.Deref(s.Tail, "") != "" && (best == nil || len(*s.Tail) > len(*best.Tail)) {
			best = s
		}
	}
	return best
}

// cutIndex returns the smallest rune boundary i such that the JSON-escaped
// length of tail[:i] is at least want bytes, or len(tail).
func cutIndex(tail string, want int) int {
	n := 0
	for i, r := range tail {
		if n >= want {
			return i
		}
		n += escapedLen(r, tail[i:])
	}
	return len(tail)
}

// escapedLen is the number of bytes encoding/json writes for the rune r
// found at the start of rest, including HTML escaping, which json.Marshal
// applies.
func escapedLen(r rune, rest string) int {
	switch {
	case r == '"' || r == '\\' || r == '\n' || r == '\r' || r == '\t':
		return 2
	case r < 0x20 || r == '<' || r == '>' || r == '&' || r == '\u2028' || r == '\u2029':
		return 6
	case r == utf8.RuneError:
		if _, size := utf8.DecodeRuneInString(rest); size == 1 {
			return 6 // an invalid byte, written as \ufffd
		}
		return 3
	default:
		return utf8.RuneLen(r)
	}
}

// setCondition sets one condition, stamped with the task's generation.
func setCondition(bt *bashtaskv1alpha1.BashTask, typ string, status bool, reason, message string) {
	s := metav1.ConditionFalse
	if status {
		s = metav1.ConditionTrue
	}
	meta.SetStatusCondition(&bt.Status.Conditions, metav1.Condition{
		Type: typ, Status: s, Reason: reason, Message: truncateMessage(message), ObservedGeneration: bt.Generation,
	})
}

// setReadiness derives the kstatus conditions (Ready, Reconciling, Stalled)
// from the rest of the status. writeStatus calls it before every write, so
// they ride along with the write the status needed anyway and never cost
// one of their own.
func setReadiness(bt *bashtaskv1alpha1.BashTask) {
	st := &bt.Status
	reason := reasonOf(st)
	switch {
	case reason == bashtaskv1alpha1.ReasonSucceeded:
		meta.RemoveStatusCondition(&st.Conditions, bashtaskv1alpha1.ConditionReconciling)
		meta.RemoveStatusCondition(&st.Conditions, bashtaskv1alpha1.ConditionStalled)
		setCondition(bt, bashtaskv1alpha1.ConditionReady, true, string(reason), ptr.Deref(st.Message, "the command succeeded"))
	case reason != "":
		message := ptr.Deref(st.Message, string(reason))
		meta.RemoveStatusCondition(&st.Conditions, bashtaskv1alpha1.ConditionReconciling)
		setCondition(bt, bashtaskv1alpha1.ConditionStalled, true, string(reason), message)
		setCondition(bt, bashtaskv1alpha1.ConditionReady, false, string(reason), message)
	default:
		why, message := progressOf(bt)
		meta.RemoveStatusCondition(&st.Conditions, bashtaskv1alpha1.ConditionStalled)
		setCondition(bt, bashtaskv1alpha1.ConditionReconciling, true, why, message)
		setCondition(bt, bashtaskv1alpha1.ConditionReady, false, why, message)
	}
}

// progressOf says why a task that has not finished is not Ready: Running,
// Suspended (only before dispatch: suspend has no effect after) or Pending
// with what it waits for.
func progressOf(bt *bashtaskv1alpha1.BashTask) (reason, message string) {
	st := &bt.Status
	scheduled := meta.FindStatusCondition(st.Conditions, bashtaskv1alpha1.ConditionScheduled)
	switch {
	case phaseOf(st) == bashtaskv1alpha1.PhaseRunning:
		return ReasonRunning, "the command is running on node " + nodeOf(st)
	case nodeOf(st) == "" && ptr.Deref(bt.Spec.Suspend, false):
		return ReasonSuspended, "spec.suspend is true; the task is not dispatched"
	case scheduled != nil && scheduled.Status == metav1.ConditionTrue && pullingMessage(st) != "":
		return ReasonPending, "node " + nodeOf(st) + " is pulling the task's image: " + pullingMessage(st)
	case scheduled != nil && scheduled.Status == metav1.ConditionTrue:
		return ReasonPending, "waiting for the agent on node " + nodeOf(st) + " to start the command"
	case scheduled != nil:
		return ReasonPending, scheduled.Reason + ": " + scheduled.Message
	}
	return ReasonPending, "waiting to be dispatched"
}

// conditionChanged reports whether a condition's status, reason or message
// differs between old and bt.
func conditionChanged(old *bashtaskv1alpha1.BashTaskStatus, bt *bashtaskv1alpha1.BashTask, typ string) bool {
	a := meta.FindStatusCondition(old.Conditions, typ)
	b := meta.FindStatusCondition(bt.Status.Conditions, typ)
	if a == nil || b == nil {
		return a != b
	}
	return a.Status != b.Status || a.Reason != b.Reason || a.Message != b.Message
}

// setPending records why a task waits before dispatch.
func setPending(bt *bashtaskv1alpha1.BashTask, reason, message string) {
	bt.Status.Phase = ptr.To(bashtaskv1alpha1.PhasePending)
	setCondition(bt, bashtaskv1alpha1.ConditionScheduled, false, reason, message)
}

// setTerminal records the task's one terminal reason. A task that already
// has a reason keeps it: the first cause wins.
func setTerminal(bt *bashtaskv1alpha1.BashTask, reason bashtaskv1alpha1.Reason, message string, now time.Time) {
	if isTerminal(bt) {
		return
	}
	st := &bt.Status
	st.Reason = ptr.To(reason)
	st.Message = optional(truncateMessage(message))
	if st.CompletionTime == nil {
		t := metav1.NewTime(now)
		st.CompletionTime = &t
	}
	if meta.FindStatusCondition(st.Conditions, bashtaskv1alpha1.ConditionRunning) != nil {
		setCondition(bt, bashtaskv1alpha1.ConditionRunning, false, ReasonFinished, "the command is not running")
	}
	if reason == bashtaskv1alpha1.ReasonSucceeded {
		st.Phase = ptr.To(bashtaskv1alpha1.PhaseSucceeded)
		setCondition(bt, bashtaskv1alpha1.ConditionComplete, true, string(reason), message)
		return
	}
	st.Phase = ptr.To(bashtaskv1alpha1.PhaseFailed)
	setCondition(bt, bashtaskv1alpha1.ConditionFailed, true, string(reason), message)
}

// maxMessage is status.message's schema limit, in characters.
const maxMessage = 4096

// maxUploadError bounds each stream's upload error in the OutputUploaded
// condition, in characters: a storage service's error can carry a whole
// response body.
const maxUploadError = 512

func truncateMessage(m string) string { return truncateTo(m, maxMessage) }

// truncateTo shortens m to at most n characters, the last an ellipsis.
func truncateTo(m string, n int) string {
	if utf8.RuneCountInString(m) <= n {
		return m
	}
	r := []rune(m)
	return string(r[:n-1]) + "…"
}

// terminalReasons is the closed set of reasons an agent may report.
var terminalReasons = map[string]bashtaskv1alpha1.Reason{
	string(bashtaskv1alpha1.ReasonSucceeded):      bashtaskv1alpha1.ReasonSucceeded,
	string(bashtaskv1alpha1.ReasonNonZeroExit):    bashtaskv1alpha1.ReasonNonZeroExit,
	string(bashtaskv1alpha1.ReasonSignaled):       bashtaskv1alpha1.ReasonSignaled,
	string(bashtaskv1alpha1.ReasonTimedOut):       bashtaskv1alpha1.ReasonTimedOut,
	string(bashtaskv1alpha1.ReasonCancelled):      bashtaskv1alpha1.ReasonCancelled,
	string(bashtaskv1alpha1.ReasonOOMKilled):      bashtaskv1alpha1.ReasonOOMKilled,
	string(bashtaskv1alpha1.ReasonStartFailed):    bashtaskv1alpha1.ReasonStartFailed,
	string(bashtaskv1alpha1.ReasonAgentRestarted): bashtaskv1alpha1.ReasonAgentRestarted,
}

// applyTaskStatus copies an agent's report of a task into bt's status. A
// terminal task only takes upload progress: its reason never changes.
func (r *BashTaskReconciler) applyTaskStatus(bt *bashtaskv1alpha1.BashTask, ts *agentv1.TaskStatus) {
	if ts == nil {
		return
	}
	if isTerminal(bt) {
		applyUploads(bt, ts)
		return
	}
	st := &bt.Status
	applyTaskImage(bt, ts)
	if t := ts.GetStartTime(); t != nil && st.StartTime == nil {
		mt := metav1.NewTime(t.AsTime())
		st.StartTime = &mt
	}
	if wd := ts.GetWorkingDir(); wd != "" {
		st.WorkingDir = ptr.To(truncateTo(wd, maxMessage))
	}
	st.Stdout = streamStatus(ts.GetStdout())
	st.Stderr = streamStatus(ts.GetStderr())
	if in := ts.GetStdin(); in != nil {
		st.Stdin = stdinStatus(in)
	}
	if m := ts.GetMechanism(); m != "" {
		iso := &bashtaskv1alpha1.IsolationStatus{Mechanism: ptr.To(bashtaskv1alpha1.IsolationMechanism(m))}
		if ti := ts.GetIsolation(); ti != nil {
			applyTaskIsolation(iso, ti)
		}
		st.Isolation = iso
		// The agent reports them from the task's start on: its word
		// replaces what its readiness said at dispatch.
		setLimitsStatus(bt, fromAgentLimits(ts.GetLimitsNotEnforced()))
	}

	if ts.GetState() != agentv1.TaskState_TASK_STATE_FINISHED {
		st.Phase = ptr.To(bashtaskv1alpha1.PhaseRunning)
		setCondition(bt, bashtaskv1alpha1.ConditionRunning, true, ReasonStarted, "the command is running on node "+nodeOf(st))
		return
	}

	reason, known := terminalReasons[ts.GetReason()]
	if !known {
		// ImageShellMissing: an image without bash is only found once
		// the task's root is assembled.
		reason, known = imageFailureReasons[ts.GetReason()]
	}
	message := ts.GetMessage()
	if !known {
		reason = bashtaskv1alpha1.ReasonSignaled
		message = fmt.Sprintf("the agent reported the unknown reason %q: %s", ts.GetReason(), message)
	}
	// The agent reports -1 for a command that never ran or whose exit it
	// could not observe (a restart): no exit code then.
	if code := ts.GetExitCode(); code >= 0 && reason != bashtaskv1alpha1.ReasonStartFailed {
		st.ExitCode = &code
	}
	st.Signal = optional(ts.GetSignal())
	n := ts.GetLeftoverProcesses()
	st.LeftoverProcesses = &n
	if t := ts.GetCompletionTime(); t != nil {
		mt := metav1.NewTime(t.AsTime())
		st.CompletionTime = &mt
	}
	if message == "" {
		message = defaultMessage(reason, st)
	}
	setTerminal(bt, reason, message, r.clock.Now())
	applyUploads(bt, ts)
}

func defaultMessage(reason bashtaskv1alpha1.Reason, st *bashtaskv1alpha1.BashTaskStatus) string {
	switch {
	case ptr.Deref(st.Signal, "") != "":
		return fmt.Sprintf("%s: the shell ended by %s", reason, *st.Signal)
	case st.ExitCode != nil:
		return fmt.Sprintf("%s: the shell exited with code %d", reason, *st.ExitCode)
	}
	return string(reason)
}

// streamStatus converts an agent's stream report, without the spill
// reference, which applyUploads sets once the object exists.
func streamStatus(s *agentv1.StreamStatus) *bashtaskv1alpha1.StreamStatus {
	if s == nil {
		return nil
	}
	return &bashtaskv1alpha1.StreamStatus{
		Tail:       optional(s.GetTail()),
		TotalBytes: ptr.To(s.GetTotalBytes()),
		Truncated:  optional(s.GetTruncated()),
		Sanitized:  optional(s.GetSanitized()),
		SHA256:     optional(s.GetSha256()),
		Parts:      streamParts(s.GetKeptBytes()),
	}
}

// streamParts is the parts block of a stream with kept bytes uploaded as
// parts; nil without any.
func streamParts(kept int64) *bashtaskv1alpha1.StreamParts {
	if kept <= 0 {
		return nil
	}
	return &bashtaskv1alpha1.StreamParts{KeptBytes: ptr.To(kept)}
}

// markOutputLost records, for a task ended without its agent (AgentLost),
// which bytes of each stream survive: the first keptBytes, uploaded as
// parts, and none after. A stream whose status tail is the whole stream
// so far is not marked: nothing of it is known lost beyond what the
// command wrote after the agent's last report, which the message says.
// It returns the sentence for the task's message.
func markOutputLost(st *bashtaskv1alpha1.BashTaskStatus) string {
	var parts []string
	for _, s := range []struct {
		name string
		ss   *bashtaskv1alpha1.StreamStatus
	}{{"stdout", st.Stdout}, {"stderr", st.Stderr}} {
		if s.ss == nil || ptr.Deref(s.ss.TotalBytes, 0) == 0 {
			continue
		}
		total := *s.ss.TotalBytes
		kept := int64(0)
		if s.ss.Parts != nil {
			kept = ptr.Deref(s.ss.Parts.KeptBytes, 0)
		}
		whole := !ptr.Deref(s.ss.Truncated, false) && !ptr.Deref(s.ss.Sanitized, false) && int64(len(ptr.Deref(s.ss.Tail, ""))) == total
		if whole && kept == 0 {
			continue
		}
		if s.ss.Parts == nil {
			s.ss.Parts = &bashtaskv1alpha1.StreamParts{}
		}
		s.ss.Parts.LostFromOffset = ptr.To(kept)
		what := fmt.Sprintf("the first %d bytes", kept)
		if kept == 0 {
			what = "no byte"
		}
		parts = append(parts, fmt.Sprintf("%s: %s kept in object storage, every byte from offset %d on lost (at least %d bytes)",
			s.name, what, kept, total-kept))
	}
	if len(parts) == 0 {
		return ""
	}
	return "; output: " + strings.Join(parts, "; ")
}

// applyUploads records the spill references and the OutputUploaded
// condition of a finished task.
func applyUploads(bt *bashtaskv1alpha1.BashTask, ts *agentv1.TaskStatus) {
	pending, uploaded, partial := []string{}, 0, []string{}
	for _, s := range []struct {
		name string
		in   *agentv1.StreamStatus
		out  *bashtaskv1alpha1.StreamStatus
	}{{"stdout", ts.GetStdout(), bt.Status.Stdout}, {"stderr", ts.GetStderr(), bt.Status.Stderr}} {
		sp := s.in.GetSpill()
		switch sp.GetUploadState() {
		case agentv1.UploadState_UPLOAD_STATE_UPLOADED:
			uploaded++
			if s.out != nil {
				s.out.Spill = &bashtaskv1alpha1.SpillRef{URL: optional(sp.GetUrl()), Bytes: ptr.To(sp.GetBytes()), Complete: optional(sp.GetComplete())}
			}
			if !sp.GetComplete() {
				partial = append(partial, fmt.Sprintf("%s (the first %d of %d bytes: the spill limit)", s.name, sp.GetBytes(), s.in.GetTotalBytes()))
			}
		case agentv1.UploadState_UPLOAD_STATE_PENDING:
			msg := s.name
			if e := sp.GetUploadError(); e != "" {
				// The agent sends the error on its first failure and
				// whenever it changes, so this is the last one.
				msg = fmt.Sprintf("%s (attempt %d failed: %s)", s.name, sp.GetUploadAttempts(), truncateTo(e, maxUploadError))
			}
			pending = append(pending, msg)
		}
	}
	switch {
	case len(pending) > 0:
		setCondition(bt, bashtaskv1alpha1.ConditionOutputUploaded, false, ReasonUploadPending,
			"upload to object storage pending for "+strings.Join(pending, ", ")+"; the agent retries and keeps the local copy")
	case uploaded > 0 && len(partial) > 0:
		setCondition(bt, bashtaskv1alpha1.ConditionOutputUploaded, true, ReasonUploaded,
			"uploaded to object storage; stored in part: "+strings.Join(partial, ", "))
	case uploaded > 0:
		setCondition(bt, bashtaskv1alpha1.ConditionOutputUploaded, true, ReasonUploaded, "the full output is in object storage")
	default:
		setCondition(bt, bashtaskv1alpha1.ConditionOutputUploaded, true, ReasonNotNeeded, "the tails in status hold the whole output")
	}
}

// uploadPending reports whether an output upload is still outstanding.
func uploadPending(bt *bashtaskv1alpha1.BashTask) bool {
	return meta.IsStatusConditionFalse(bt.Status.Conditions, bashtaskv1alpha1.ConditionOutputUploaded)
}

// eventType is Normal for a success and Warning for any other ending.
func eventType(bt *bashtaskv1alpha1.BashTask) string {
	if reasonOf(&bt.Status) == bashtaskv1alpha1.ReasonSucceeded {
		return corev1.EventTypeNormal
	}
	return corev1.EventTypeWarning
}

// finishNote is the event text of a task's end.
func finishNote(bt *bashtaskv1alpha1.BashTask) string {
	message := ptr.Deref(bt.Status.Message, "")
	if nodeOf(&bt.Status) == "" {
		return truncateMessage(message)
	}
	return truncateMessage("on node " + nodeOf(&bt.Status) + ": " + message)
}

// phaseOf is the task's phase, "" before the controller first wrote one.
func phaseOf(st *bashtaskv1alpha1.BashTaskStatus) bashtaskv1alpha1.Phase {
	return ptr.Deref(st.Phase, "")
}

// reasonOf is the task's terminal reason, "" while it has none.
func reasonOf(st *bashtaskv1alpha1.BashTaskStatus) bashtaskv1alpha1.Reason {
	return ptr.Deref(st.Reason, "")
}

// nodeOf is the node the task was dispatched to, "" before dispatch.
func nodeOf(st *bashtaskv1alpha1.BashTaskStatus) string {
	return ptr.Deref(st.NodeName, "")
}

// optional returns v for an optional status field, or nil for the zero
// value: an empty string, false or 0 is left out of the status rather than
// written, which also keeps it out of the status budget.
func optional[T comparable](v T) *T {
	var zero T
	if v == zero {
		return nil
	}
	return &v
}

// applyTaskIsolation copies what isolation the agent applied into iso.
func applyTaskIsolation(iso *bashtaskv1alpha1.IsolationStatus, ti *agentv1.TaskIsolation) {
	if l := ti.GetLevel(); l != "" {
		iso.Level = ptr.To(bashtaskv1alpha1.IsolationLevel(l))
	}
	if ti.User != nil {
		iso.User = ptr.To(int64(ti.GetUser()))
	}
	iso.Namespaces = slices.Clone(ti.GetNamespaces())
	if ti.GetLevel() == string(bashtaskv1alpha1.IsolationLevelTenant) {
		iso.LandlockABI = ptr.To(ti.GetLandlockAbi())
		iso.Seccomp = ptr.To(ti.GetSeccomp())
	}
	if n := ti.GetNetwork(); n != "" {
		iso.Network = ptr.To(bashtaskv1alpha1.TaskNetwork(n))
	}
	if p := ti.GetPidsLimit(); p != "" {
		iso.ProcessLimit = ptr.To(p)
	}
}

// stdinStatus is the agent's report of a streamed input as status.stdin.
func stdinStatus(in *agentv1.StdinState) *bashtaskv1alpha1.StdinStatus {
	out := &bashtaskv1alpha1.StdinStatus{AcceptedBytes: ptr.To(in.GetAcceptedBytes()), Closed: ptr.To(in.GetClosed())}
	switch in.GetReason() {
	case agentv1.StdinCloseReason_STDIN_CLOSE_REASON_CLOSED:
		out.Reason = ptr.To(bashtaskv1alpha1.StdinClosed)
	case agentv1.StdinCloseReason_STDIN_CLOSE_REASON_IDLE_TIMEOUT:
		out.Reason = ptr.To(bashtaskv1alpha1.StdinIdleTimeout)
	case agentv1.StdinCloseReason_STDIN_CLOSE_REASON_PROCESS_EXITED:
		out.Reason = ptr.To(bashtaskv1alpha1.StdinProcessExited)
	}
	return out
}
