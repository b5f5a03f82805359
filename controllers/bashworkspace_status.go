package controllers

import (
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	agentv1 "github.com/bashtask/bashtask-operator/api/agent/v1"
	bashtaskv1alpha1 "github.com/bashtask/bashtask-operator/api/v1alpha1"
)

// maxCarryMessage is status.carryMessage's schema limit, in characters.
const maxCarryMessage = 1024

// noStorageCap is the status message of a Ready workspace whose node
// cannot give it a file system of its own.
const noStorageCap = "; its node cannot cap its storage (no loop devices or mkfs.ext4 there), so it is a plain directory of the node's file system: spec.storage is not enforced and usedBytes is not measured"

// noSnapshots is added to the status message of a Ready workspace whose
// agent has no bucket the nodes share (the snapshots capability).
const noSnapshots = "; its agent has no bucket the nodes share (--output-bucket-url), so it is never snapshotted: if its node is lost, its files are lost with it"

// workspacePhaseOf is the workspace's phase, "" before the controller
// first wrote one.
func workspacePhaseOf(st *bashtaskv1alpha1.BashWorkspaceStatus) bashtaskv1alpha1.WorkspacePhase {
	return ptr.Deref(st.Phase, "")
}

// workspaceSpec builds the agent's request for ws.
func workspaceSpec(ws *bashtaskv1alpha1.BashWorkspace) *agentv1.WorkspaceSpec {
	spec := &agentv1.WorkspaceSpec{
		Ref:             workspaceRefOf(ws),
		Network:         string(ptr.Deref(ws.Spec.Network, "")),
		CarryWorkingDir: true,
		Owner:           ptr.Deref(ws.Spec.Owner, ""),
		// A draining agent waits only for the workspaces the controller
		// moves (drained).
		Pinned: ptr.Deref(ws.Spec.NodeName, "") != "",
		Egress: egressPolicySpec(ws.Spec.Egress),
	}
	if ws.Spec.Storage != nil {
		spec.StorageBytes = ws.Spec.Storage.Value()
	}
	if c := ws.Spec.CarryOver; c != nil {
		spec.CarryWorkingDir = ptr.Deref(c.WorkingDir, true)
		spec.CarryEnv = ptr.Deref(c.Environment, false)
	}
	return spec
}

// applyWorkspaceStatus copies the agent's report of a workspace on node
// into ws's status and makes it Ready.
func applyWorkspaceStatus(ws *bashtaskv1alpha1.BashWorkspace, st *agentv1.WorkspaceStatus, node string) {
	s := &ws.Status
	s.NodeName = ptr.To(node)
	s.RunAsUser = ptr.To(int64(st.GetRunAsUser()))
	s.Path = optional(st.GetPath())
	s.WorkingDir = optional(st.GetWorkingDir())
	s.CarryMessage = optional(truncateTo(st.GetCarryMessage(), maxCarryMessage))
	s.RunningTasks = ptr.To(st.GetRunningTasks())
	if n := st.GetNetwork(); n != "" {
		s.Network = ptr.To(bashtaskv1alpha1.TaskNetwork(n))
	}
	if t := st.GetLastTaskEnd(); t != nil {
		// Seconds, as the API stores them: a finer time would differ from
		// the stored one on every pass and cost a write each time.
		lt := metav1.NewTime(t.AsTime().Truncate(time.Second))
		if s.LastTaskTime == nil || lt.After(s.LastTaskTime.Time) {
			s.LastTaskTime = &lt
		}
	}
	if n := st.GetLastTaskName(); n != "" {
		s.LastTask = ptr.To(n)
	}
	msg := "ready on node " + node
	if st.GetStorageEnforced() {
		s.UsedBytes = ptr.To(st.GetUsedBytes())
		s.CapacityBytes = ptr.To(st.GetCapacityBytes())
	} else {
		s.UsedBytes, s.CapacityBytes = nil, nil
		msg += noStorageCap
	}
	setWorkspacePhase(ws, bashtaskv1alpha1.WorkspaceReady, msg)
	applyWorkspaceImage(ws, st)
}

// setWorkspacePhase records the workspace's phase and its message.
func setWorkspacePhase(ws *bashtaskv1alpha1.BashWorkspace, phase bashtaskv1alpha1.WorkspacePhase, message string) {
	ws.Status.Phase = ptr.To(phase)
	ws.Status.Message = optional(truncateMessage(message))
}

// setWorkspaceConditions derives the kstatus conditions from the phase, as
// for a task: Reconciling while Pending or Terminating, Ready when Ready,
// Stalled when NodeLost or Failed; never Reconciling and Stalled together.
// writeStatus calls it before every write.
func setWorkspaceConditions(ws *bashtaskv1alpha1.BashWorkspace) {
	st := &ws.Status
	message := ptr.Deref(st.Message, "")
	set := func(typ string, status bool, reason string) {
		s := metav1.ConditionFalse
		if status {
			s = metav1.ConditionTrue
		}
		meta.SetStatusCondition(&st.Conditions, metav1.Condition{
			Type: typ, Status: s, Reason: reason, Message: message, ObservedGeneration: ws.Generation,
		})
	}
	switch workspacePhaseOf(st) {
	case bashtaskv1alpha1.WorkspaceReady:
		meta.RemoveStatusCondition(&st.Conditions, bashtaskv1alpha1.ConditionReconciling)
		meta.RemoveStatusCondition(&st.Conditions, bashtaskv1alpha1.ConditionStalled)
		set(bashtaskv1alpha1.ConditionReady, true, bashtaskv1alpha1.WorkspaceReasonReady)
	case bashtaskv1alpha1.WorkspaceNodeLost:
		meta.RemoveStatusCondition(&st.Conditions, bashtaskv1alpha1.ConditionReconciling)
		set(bashtaskv1alpha1.ConditionStalled, true, bashtaskv1alpha1.WorkspaceReasonNodeLost)
		set(bashtaskv1alpha1.ConditionReady, false, bashtaskv1alpha1.WorkspaceReasonNodeLost)
	case bashtaskv1alpha1.WorkspaceFailed:
		meta.RemoveStatusCondition(&st.Conditions, bashtaskv1alpha1.ConditionReconciling)
		set(bashtaskv1alpha1.ConditionStalled, true, failedReason(st))
		set(bashtaskv1alpha1.ConditionReady, false, failedReason(st))
	case bashtaskv1alpha1.WorkspaceSuspended:
		meta.RemoveStatusCondition(&st.Conditions, bashtaskv1alpha1.ConditionReconciling)
		meta.RemoveStatusCondition(&st.Conditions, bashtaskv1alpha1.ConditionStalled)
		set(bashtaskv1alpha1.ConditionReady, false, bashtaskv1alpha1.WorkspaceReasonSuspended)
	case bashtaskv1alpha1.WorkspaceTerminating:
		meta.RemoveStatusCondition(&st.Conditions, bashtaskv1alpha1.ConditionStalled)
		set(bashtaskv1alpha1.ConditionReconciling, true, bashtaskv1alpha1.WorkspaceReasonTerminating)
		set(bashtaskv1alpha1.ConditionReady, false, bashtaskv1alpha1.WorkspaceReasonTerminating)
	default:
		if st.Phase == nil {
			st.Phase = ptr.To(bashtaskv1alpha1.WorkspacePending)
		}
		if message == "" {
			message = "waiting to be placed"
			st.Message = ptr.To(message)
		}
		meta.RemoveStatusCondition(&st.Conditions, bashtaskv1alpha1.ConditionStalled)
		set(bashtaskv1alpha1.ConditionReconciling, true, bashtaskv1alpha1.WorkspaceReasonPending)
		set(bashtaskv1alpha1.ConditionReady, false, bashtaskv1alpha1.WorkspaceReasonPending)
	}
}
