package v1alpha1

import (
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Limits of the BashWorkspace API, enforced by the CRD schema and repeated
// here for clients and the controller.
const (
	// MaxIdleTimeoutSeconds is the largest spec.idleTimeoutSeconds: 30 days.
	MaxIdleTimeoutSeconds = 30 * 24 * 3600

	// MaxSnapshotAfterTaskSeconds is the largest
	// spec.snapshot.afterTaskSeconds: a day.
	MaxSnapshotAfterTaskSeconds = 86400

	// WorkspacePath is the root of every workspace as its tasks see it, and
	// their HOME: the same on every node, so that a carried directory and
	// a path in a script mean the same wherever the workspace lives.
	WorkspacePath = "/home/task"
)

// BashWorkspaceSpec is a session's home on one node: a directory with a
// size limit, a UID leased for its life, a network its tasks share, and
// what carries over from one task to the next. owner, placement, storage
// and network are immutable; carryOver and idleTimeoutSeconds may change
// and apply from the next task on.
//
// +kubebuilder:validation:XValidation:rule="has(self.owner) == has(oldSelf.owner)",message="spec.owner of a BashWorkspace is immutable (it cannot be added or removed): create a new workspace for another owner"
// +kubebuilder:validation:XValidation:rule="has(self.nodeName) == has(oldSelf.nodeName)",message="spec.nodeName of a BashWorkspace is immutable (it cannot be added or removed): the workspace's files live on its node"
// +kubebuilder:validation:XValidation:rule="has(self.nodeSelector) == has(oldSelf.nodeSelector)",message="spec.nodeSelector of a BashWorkspace is immutable (it cannot be added or removed): the workspace's files live on its node"
// +kubebuilder:validation:XValidation:rule="has(self.storage) == has(oldSelf.storage)",message="spec.storage of a BashWorkspace is immutable (it cannot be added or removed): its file system is made once"
// +kubebuilder:validation:XValidation:rule="has(self.network) == has(oldSelf.network)",message="spec.network of a BashWorkspace is immutable (it cannot be added or removed): its tasks share one network namespace"
// +kubebuilder:validation:XValidation:rule="!has(self.egress) || (has(self.network) && self.network == 'Egress')",message="spec.egress needs spec.network Egress: only that network's connections go through the agent's resolver and rules"
// +kubebuilder:validation:XValidation:rule="has(self.image) == has(oldSelf.image)",message="spec.image of a BashWorkspace is immutable (it cannot be added or removed): its files are changes on top of that image; create a new workspace for another image"
// +kubebuilder:validation:XValidation:rule="has(self.rootInside) == has(oldSelf.rootInside)",message="spec.rootInside of a BashWorkspace is immutable (it cannot be added or removed): the files its tasks installed are owned accordingly"
// +kubebuilder:validation:XValidation:rule="has(self.source) == has(oldSelf.source)",message="spec.source of a BashWorkspace is immutable (it cannot be added or removed): a workspace is copied once, when it is made"
type BashWorkspaceSpec struct {
	// owner is the opaque token of the one owner whose tasks may run here:
	// a task naming this workspace with another spec.owner (or none, when
	// this is set) is refused with InvalidSpec naming both. Unset: tasks
	// of any owner, and tasks without one, may use it. 1 to 253
	// characters. Immutable.
	// +optional
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="spec.owner of a BashWorkspace is immutable: create a new workspace for another owner"
	Owner *string `json:"owner,omitempty"`

	// nodeName makes the workspace on the agent of this node. Immutable.
	// +optional
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="spec.nodeName of a BashWorkspace is immutable: the workspace's files live on its node"
	NodeName *string `json:"nodeName,omitempty"`

	// nodeSelector makes the workspace on an agent whose Node carries all
	// of these labels; unset with nodeName unset: the least loaded agent.
	// At most 32 entries. Immutable.
	// +optional
	// +kubebuilder:validation:MaxProperties=32
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="spec.nodeSelector of a BashWorkspace is immutable: the workspace's files live on its node"
	NodeSelector map[string]string `json:"nodeSelector,omitempty"`

	// storage is the size of the workspace's file system, a quantity from
	// 32Mi to 16Ti such as 5Gi: a write past it fails with "No space left
	// on device" in this workspace only. Unset means the agent's default
	// (--task-disk-size, 10Gi in the chart); above the agent's cap
	// (--task-disk-cap) the workspace fails with the reason InvalidSpec.
	// Immutable.
	// +optional
	// +kubebuilder:validation:XValidation:rule="quantity(string(self)).compareTo(quantity('32Mi')) >= 0",message="spec.storage must be at least 32Mi"
	// +kubebuilder:validation:XValidation:rule="quantity(string(self)).compareTo(quantity('16Ti')) <= 0",message="spec.storage must be at most 16Ti"
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="spec.storage of a BashWorkspace is immutable: its file system is made once"
	Storage *resource.Quantity `json:"storage,omitempty"`

	// network is the network every task of the workspace reaches, one
	// network namespace they share (a server one task starts on 127.0.0.1
	// is reachable from the workspace's other tasks, and from no other
	// workspace): None (loopback only) or Egress (loopback and a NATed
	// route out, as for a task), or Node where the agent allows it. Unset
	// means the agent's default (Egress at the tenant level). Immutable.
	// +optional
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="spec.network of a BashWorkspace is immutable: its tasks share one network namespace"
	Network *TaskNetwork `json:"network,omitempty"`

	// egress limits the domain names the workspace's tasks reach
	// (docs/egress.md); needs network Egress. It may change while the
	// workspace lives: new connections follow within a second, open ones
	// stay open, and the EgressPolicy condition names the generation in
	// force. Unset: no limit by name.
	// +optional
	Egress *EgressPolicy `json:"egress,omitempty"`

	// image is the OCI image whose file system the workspace's tasks run
	// in: its layers are the read-only lower layers of the tasks' root,
	// and what tasks write outside HOME (apt-get install, edits under
	// /etc) stays in the workspace, counts against its storage and goes
	// into its snapshots (docs/images.md). Resolved to a digest once,
	// when the workspace is first made (status.image.digest). Unset: the
	// agent's default image (--default-image), or the node's root file
	// system when the agent has none. Immutable.
	// +optional
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="spec.image of a BashWorkspace is immutable: its files are changes on top of that image; create a new workspace for another image"
	Image *ImageReference `json:"image,omitempty"`

	// imagePullSecrets names Secrets of type
	// kubernetes.io/dockerconfigjson in the workspace's namespace whose
	// credentials pull spec.image, as a pod's spec.imagePullSecrets. At
	// most 16.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=16
	ImagePullSecrets []ImagePullSecret `json:"imagePullSecrets,omitempty"`

	// rootInside runs the workspace's tasks as root inside their image:
	// uid 0 of a user namespace of their own that maps 0 to the
	// workspace's UID and GID alone, without capabilities, so that
	// apt-get and dpkg install packages into the workspace
	// (docs/images.md, "Root inside"). The kernel still sees the
	// workspace's UID and every tenant rule holds. Needs an image
	// (spec.image, or the agent's default image) and an agent whose node
	// allows user namespaces (the root-inside capability). Immutable.
	// Unset: false, the tasks run as the workspace's UID.
	// +optional
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="spec.rootInside of a BashWorkspace is immutable: the files its tasks installed are owned accordingly"
	RootInside *bool `json:"rootInside,omitempty"`

	// carryOver says what the workspace keeps from one task to the next.
	// Unset: the working directory carries over, the environment does not.
	// +optional
	CarryOver *CarryOver `json:"carryOver,omitempty"`

	// idleTimeoutSeconds acts on the workspace (idleAction) after it has
	// had no running task for this many seconds (counted from its last
	// task's end, or from when it became Ready on its node when that is
	// later), 1 to 2592000 (30
	// days). Unset: kept on its node until deleted.
	// +optional
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=2592000
	IdleTimeoutSeconds *int32 `json:"idleTimeoutSeconds,omitempty"`

	// idleAction is what the idle timeout does: Suspend snapshots the
	// workspace and releases its node's copy, as suspend does, and its
	// next task restores it (agents with a bucket the nodes share, the
	// snapshots capability; else the workspace is kept); Delete deletes
	// the object. Unset: Suspend where the agent can snapshot, else
	// Delete.
	// +optional
	IdleAction *WorkspaceIdleAction `json:"idleAction,omitempty"`

	// suspend keeps the workspace off every node while true: the
	// controller snapshots it once its running tasks have ended, then
	// releases its node's copy and UID (phase Suspended). While it is
	// true a new task naming the workspace is not dispatched: it ends
	// WorkspaceUnavailable at once. Set back to false, the workspace is
	// restored from the snapshot at once on a node that fits its
	// placement. Needs agents with a bucket.
	// +optional
	Suspend *bool `json:"suspend,omitempty"`

	// snapshot says when the workspace is snapshotted besides suspend and
	// the idle timeout.
	// +optional
	Snapshot *WorkspaceSnapshotPolicy `json:"snapshot,omitempty"`

	// source makes the workspace a fork: a copy of another workspace's
	// files and carried state as of one instant (docs/workspaces.md,
	// "Forking a workspace"). Unset: the workspace starts empty.
	// Immutable.
	// +optional
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="spec.source of a BashWorkspace is immutable: a workspace is copied once, when it is made"
	Source *WorkspaceSource `json:"source,omitempty"`
}

// WorkspaceSource names what a forked workspace is copied from.
type WorkspaceSource struct {
	// workspace is the name of the BashWorkspace in the same namespace
	// whose files and carried state are copied. Ready: copied on its node
	// while its writes are frozen (or through a snapshot when the fork is
	// placed on another node); Suspended: restored from its last
	// snapshot. Its spec.owner must be the fork's (docs/workspaces.md,
	// "Forking a workspace"). 1 to 253 characters.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	Workspace string `json:"workspace,omitempty"`
}

// WorkspaceForkMethod is how a fork's files were copied.
// +kubebuilder:validation:Enum=Reflink;SparseCopy;Archive;Snapshot
type WorkspaceForkMethod string

const (
	// WorkspaceForkReflink means the source's file system image was cloned
	// (FICLONE) while frozen; its blocks are shared until written.
	WorkspaceForkReflink WorkspaceForkMethod = "Reflink"
	// WorkspaceForkSparseCopy means the data extents of the source's file
	// system image (SEEK_DATA, SEEK_HOLE) were copied while frozen.
	WorkspaceForkSparseCopy WorkspaceForkMethod = "SparseCopy"
	// WorkspaceForkArchive means the source's tree was archived into the fork
	// on the node, as a snapshot is, without a freeze (a source without a
	// file system of its own).
	WorkspaceForkArchive WorkspaceForkMethod = "Archive"
	// WorkspaceForkSnapshot means the fork was restored from a snapshot of the
	// source (another node, or a suspended source).
	WorkspaceForkSnapshot WorkspaceForkMethod = "Snapshot"
)

// WorkspaceForkStatus says what a forked workspace was copied from, as of
// when, and how long the source's writes were frozen for it.
type WorkspaceForkStatus struct {
	// workspace is the source BashWorkspace's name.
	// +optional
	// +kubebuilder:validation:MaxLength=253
	Workspace *string `json:"workspace,omitempty"`
	// uid is the source's metadata.uid.
	// +optional
	// +kubebuilder:validation:MaxLength=128
	UID *string `json:"uid,omitempty"`
	// nodeName is the node the source was copied on (its node).
	// +optional
	// +kubebuilder:validation:MaxLength=253
	NodeName *string `json:"nodeName,omitempty"`
	// method is how the files were copied.
	// +optional
	Method *WorkspaceForkMethod `json:"method,omitempty"`
	// time is the instant the copy is of: the freeze, or the snapshot's
	// start.
	// +optional
	Time *metav1.Time `json:"time,omitempty"`
	// frozenMicroseconds is how long the source's writes were frozen
	// (FIFREEZE) for the copy, in microseconds; 0 for a copy made without
	// a freeze.
	// +optional
	// +kubebuilder:validation:Minimum=0
	FrozenMicroseconds *int64 `json:"frozenMicroseconds,omitempty"`
	// snapshotURL is the snapshot the fork was restored from (method
	// Snapshot).
	// +optional
	// +kubebuilder:validation:MaxLength=2048
	SnapshotURL *string `json:"snapshotURL,omitempty"`
}

// WorkspaceIdleAction is what a workspace's idle timeout does.
// +kubebuilder:validation:Enum=Suspend;Delete
type WorkspaceIdleAction string

const (
	// WorkspaceIdleSuspend snapshots the workspace and releases its node's
	// copy; its next task restores it.
	WorkspaceIdleSuspend WorkspaceIdleAction = "Suspend"
	// WorkspaceIdleDelete deletes the BashWorkspace.
	WorkspaceIdleDelete WorkspaceIdleAction = "Delete"
)

// WorkspaceSnapshotPolicy says when a workspace is snapshotted to the
// agents' bucket (docs/workspaces.md, "Snapshots").
type WorkspaceSnapshotPolicy struct {
	// intervalSeconds snapshots the workspace this often while a task of
	// it runs, so that a lost node loses at most this much work; 60 to
	// 86400. Unset: no snapshot while tasks run.
	// +optional
	// +kubebuilder:validation:Minimum=60
	// +kubebuilder:validation:Maximum=86400
	IntervalSeconds *int32 `json:"intervalSeconds,omitempty"`

	// request asks for one snapshot: each new value has the controller
	// take one, and status.snapshot.request then holds the value.
	// `kubectl bashtask workspace snapshot` writes the time. 1 to 63
	// characters.
	// +optional
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	Request *string `json:"request,omitempty"`

	// afterTaskSeconds snapshots the workspace this many seconds after its
	// last task ended, when a task ended since its last snapshot, without
	// suspending it: a lost node then loses at most the work of this
	// delay after a task. 0 turns it off; 1 to 86400 otherwise. Unset:
	// the controller's --workspace-snapshot-after-task (300 s). Needs
	// agents with a bucket the nodes share (the snapshots capability);
	// without one the status message says the workspace is not
	// snapshotted.
	// +optional
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=86400
	AfterTaskSeconds *int32 `json:"afterTaskSeconds,omitempty"`
}

// CarryOver says what a workspace's next task inherits from the shell of
// the last task that ended.
type CarryOver struct {
	// workingDir starts the next task in the directory the last task's
	// shell ended in (also after `exit`, a failure or a timeout). Default
	// true.
	// +optional
	// +default=true
	WorkingDir *bool `json:"workingDir,omitempty"`

	// environment gives the next task the variables the last task's shell
	// had exported, less the managed BASHTASK_* names and the names the
	// credential scrub removes (containing KEY, SECRET, TOKEN or
	// PASSWORD). They stay on the node, readable only by the workspace's
	// UID, and never appear in the API. A task's own spec.env wins over
	// them. Default false.
	// +optional
	// +default=false
	Environment *bool `json:"environment,omitempty"`
}

// WorkspacePhase summarizes where a workspace is in its life.
//
// +kubebuilder:validation:Enum=Pending;Ready;Suspended;Terminating;NodeLost;Failed
type WorkspacePhase string

const (
	// WorkspacePending means the workspace waits for an agent or is being
	// made.
	WorkspacePending WorkspacePhase = "Pending"
	// WorkspaceReady means the workspace exists on its node and takes
	// tasks.
	WorkspaceReady WorkspacePhase = "Ready"
	// WorkspaceSuspended means the workspace is on no node: its files and
	// carried state are in its last snapshot (status.snapshot). Its next
	// task restores it on a node, unless spec.suspend is true: then
	// spec.suspend set back to false does.
	WorkspaceSuspended WorkspacePhase = "Suspended"
	// WorkspaceTerminating means the workspace is being deleted: its
	// running tasks are stopped, then its directory, network and UID go.
	WorkspaceTerminating WorkspacePhase = "Terminating"
	// WorkspaceNodeLost means the workspace's node or agent is gone (its
	// agent unreachable past the controller's --agent-lost-after, or its
	// Node deleted, or the agent no longer holds it): its files went with
	// the node. The object is kept, tasks naming it are refused.
	WorkspaceNodeLost WorkspacePhase = "NodeLost"
	// WorkspaceFailed means the workspace cannot be made (a storage size
	// over the agent's cap, a network the agent does not allow).
	WorkspaceFailed WorkspacePhase = "Failed"
)

// Condition types and reasons of a BashWorkspace. Ready, Reconciling and
// Stalled are the kstatus conditions as for a BashTask
// (ConditionReady, ConditionReconciling, ConditionStalled).
const (
	// WorkspaceReasonPending: no agent fits the placement yet, or the
	// agent is making the workspace.
	WorkspaceReasonPending = "Pending"
	// WorkspaceReasonReady: the workspace exists on its node.
	WorkspaceReasonReady = "Ready"
	// WorkspaceReasonTerminating: the workspace is being deleted.
	WorkspaceReasonTerminating = "Terminating"
	// WorkspaceReasonNodeLost: the workspace's node or agent is gone.
	WorkspaceReasonNodeLost = "NodeLost"
	// WorkspaceReasonSuspended: the workspace is in its snapshot only.
	WorkspaceReasonSuspended = "Suspended"
	// WorkspaceReasonSnapshotted: a snapshot of the workspace was taken.
	WorkspaceReasonSnapshotted = "Snapshotted"
	// WorkspaceReasonSnapshotFailed: a snapshot could not be written (the
	// bucket failed); the earlier snapshot stays the workspace's.
	WorkspaceReasonSnapshotFailed = "SnapshotFailed"
	// WorkspaceReasonRestored: the workspace was made on a node from its
	// snapshot.
	WorkspaceReasonRestored = "Restored"
	// WorkspaceReasonInvalidSpec: the agent refused the spec (the message
	// names the field and the limit).
	WorkspaceReasonInvalidSpec = "InvalidSpec"
	// WorkspaceReasonSnapshotRefused: status.snapshot names an object
	// outside the workspace's own snapshots (another workspace's, or one
	// of an earlier workspace of the same name); nothing was restored.
	WorkspaceReasonSnapshotRefused = "SnapshotRefused"
	// WorkspaceReasonForkRefused: spec.source names a workspace that
	// cannot be forked into this one (another owner, not found, Failed
	// or lost); the message says which.
	WorkspaceReasonForkRefused = "ForkRefused"
	// WorkspaceReasonForked: the workspace was made as a copy of
	// spec.source (status.forkedFrom).
	WorkspaceReasonForked = "Forked"
)

// BashWorkspaceStatus is what the controller observed of a workspace.
type BashWorkspaceStatus struct {
	// conditions are Ready, Reconciling and Stalled (kstatus).
	// +optional
	// +listType=map
	// +listMapKey=type
	// +patchStrategy=merge
	// +patchMergeKey=type
	// +kubebuilder:validation:MaxItems=8
	Conditions []metav1.Condition `json:"conditions,omitempty" patchStrategy:"merge" patchMergeKey:"type"`

	// observedGeneration is the generation the status was computed for.
	// +optional
	// +kubebuilder:validation:Minimum=0
	ObservedGeneration *int64 `json:"observedGeneration,omitempty"`

	// phase summarizes the conditions.
	// +optional
	Phase *WorkspacePhase `json:"phase,omitempty"`

	// message explains the phase in a sentence.
	// +optional
	// +kubebuilder:validation:MaxLength=4096
	Message *string `json:"message,omitempty"`

	// nodeName is the node that holds the workspace.
	// +optional
	// +kubebuilder:validation:MaxLength=253
	NodeName *string `json:"nodeName,omitempty"`

	// image is the image the workspace's tasks run in, the digest it
	// resolved to, and the pull's progress while its node pulls it;
	// absent for a workspace on the node's root file system.
	// +optional
	Image *ImageStatus `json:"image,omitempty"`

	// runAsUser is the UID (and GID) the workspace's tasks run as, leased
	// for the workspace's life.
	// +optional
	// +kubebuilder:validation:Minimum=0
	RunAsUser *int64 `json:"runAsUser,omitempty"`

	// path is the workspace's root as its tasks see it, also their HOME
	// (/home/task).
	// +optional
	// +kubebuilder:validation:MaxLength=4096
	Path *string `json:"path,omitempty"`

	// workingDir is the directory the next task starts in, as tasks see
	// it.
	// +optional
	// +kubebuilder:validation:MaxLength=4096
	WorkingDir *string `json:"workingDir,omitempty"`

	// carryMessage says why the last task's state did not carry over (its
	// directory is gone, it ended outside the workspace, its shell was
	// replaced by exec or killed before it could say); unset when it did.
	// +optional
	// +kubebuilder:validation:MaxLength=1024
	CarryMessage *string `json:"carryMessage,omitempty"`

	// usedBytes is what the workspace's file system holds.
	// +optional
	// +kubebuilder:validation:Minimum=0
	UsedBytes *int64 `json:"usedBytes,omitempty"`

	// capacityBytes is the size of the workspace's file system; unset
	// when the node cannot cap it (see the message).
	// +optional
	// +kubebuilder:validation:Minimum=0
	CapacityBytes *int64 `json:"capacityBytes,omitempty"`

	// runningTasks counts the workspace's tasks that run now.
	// +optional
	// +kubebuilder:validation:Minimum=0
	RunningTasks *int32 `json:"runningTasks,omitempty"`

	// network is the network the workspace's tasks get.
	// +optional
	Network *TaskNetwork `json:"network,omitempty"`

	// lastTaskTime is when the workspace's last task ended, the start of
	// its idle time.
	// +optional
	LastTaskTime *metav1.Time `json:"lastTaskTime,omitempty"`

	// lastTask is the name of the BashTask whose end workingDir and the
	// carried environment come from (or whose end did not carry, see
	// carryMessage).
	// +optional
	// +kubebuilder:validation:MaxLength=253
	LastTask *string `json:"lastTask,omitempty"`

	// epoch grows by one each time the workspace is made on a node: the
	// agent holding the current epoch is the only one that runs its
	// tasks, and a copy of an older epoch (an agent back after its
	// workspace moved) refuses them and is removed.
	// +optional
	Epoch *int64 `json:"epoch,omitempty"`

	// snapshot is the workspace's last snapshot.
	// +optional
	Snapshot *WorkspaceSnapshotStatus `json:"snapshot,omitempty"`

	// restoredFrom is the snapshot the workspace's current copy was made
	// from; unset for a copy made empty.
	// +optional
	RestoredFrom *WorkspaceRestoreStatus `json:"restoredFrom,omitempty"`

	// forkedFrom says what the workspace was forked from (spec.source),
	// as of when, and how long the source was frozen for the copy.
	// +optional
	ForkedFrom *WorkspaceForkStatus `json:"forkedFrom,omitempty"`

	// nodeLoss is the loss of the node that held the workspace's last
	// copy, while the workspace waits to be restored from its snapshot;
	// the restore moves it into restoredFrom.
	// +optional
	NodeLoss *WorkspaceNodeLoss `json:"nodeLoss,omitempty"`
}

// WorkspaceNodeLoss is a node, and the copy of a workspace it held, lost.
type WorkspaceNodeLoss struct {
	// nodeName is the node that was lost.
	// +optional
	// +kubebuilder:validation:MaxLength=253
	NodeName *string `json:"nodeName,omitempty"`
	// time is when the controller declared it lost.
	// +optional
	Time *metav1.Time `json:"time,omitempty"`
}

// WorkspaceSnapshotStatus is one snapshot of a workspace in the agents'
// bucket.
type WorkspaceSnapshotStatus struct {
	// url is the snapshot's object.
	// +optional
	// +kubebuilder:validation:MaxLength=2048
	URL *string `json:"url,omitempty"`
	// bytes is the object's size: a restore refuses an object of another
	// size.
	// +optional
	// +kubebuilder:validation:Minimum=0
	Bytes *int64 `json:"bytes,omitempty"`
	// sha256 is the object's digest, 64 hex digits: a restore refuses an
	// object of another digest.
	// +optional
	// +kubebuilder:validation:MaxLength=64
	SHA256 *string `json:"sha256,omitempty"`
	// dataBytes is the bytes of file content it holds.
	// +optional
	// +kubebuilder:validation:Minimum=0
	DataBytes *int64 `json:"dataBytes,omitempty"`
	// time is when the snapshot began: no write after it is in it.
	// +optional
	Time *metav1.Time `json:"time,omitempty"`
	// epoch is the epoch of the copy it was taken from.
	// +optional
	// +kubebuilder:validation:Minimum=0
	Epoch *int64 `json:"epoch,omitempty"`
	// changedFiles counts the files that tasks wrote while the snapshot
	// read them: their content is from some moment during it.
	// +optional
	// +kubebuilder:validation:Minimum=0
	ChangedFiles *int32 `json:"changedFiles,omitempty"`
	// request is spec.snapshot.request when the snapshot answered it.
	// +optional
	// +kubebuilder:validation:MaxLength=63
	Request *string `json:"request,omitempty"`
}

// WorkspaceRestoreStatus says which snapshot a workspace's copy was made
// from, and how old it was then.
type WorkspaceRestoreStatus struct {
	// url is the snapshot's object.
	// +optional
	// +kubebuilder:validation:MaxLength=2048
	URL *string `json:"url,omitempty"`
	// snapshotTime is when that snapshot began.
	// +optional
	SnapshotTime *metav1.Time `json:"snapshotTime,omitempty"`
	// restoreTime is when the copy was made from it.
	// +optional
	RestoreTime *metav1.Time `json:"restoreTime,omitempty"`
	// ageSeconds is how old the snapshot was at restoreTime: the work of
	// that last stretch before it may be lost.
	// +optional
	// +kubebuilder:validation:Minimum=0
	AgeSeconds *int64 `json:"ageSeconds,omitempty"`
	// lostNode is the node whose loss made the restore necessary; unset
	// for a restore after a suspend, which loses nothing.
	// +optional
	// +kubebuilder:validation:MaxLength=253
	LostNode *string `json:"lostNode,omitempty"`
	// lostTime is when lostNode was declared lost: what the workspace's
	// tasks wrote between snapshotTime and it is gone.
	// +optional
	LostTime *metav1.Time `json:"lostTime,omitempty"`
	// firstTask is the BashTask that carries the notice of this restore
	// (its status.workspaceRestore): the first task dispatched to the
	// restored copy.
	// +optional
	// +kubebuilder:validation:MaxLength=253
	FirstTask *string `json:"firstTask,omitempty"`
}

// WorkspaceRestoreNotice tells the first task dispatched to a restored
// copy of its workspace where the copy came from: files its workspace's
// tasks wrote after snapshotTime are not in it.
type WorkspaceRestoreNotice struct {
	// workspace is the BashWorkspace's name.
	// +optional
	// +kubebuilder:validation:MaxLength=253
	Workspace *string `json:"workspace,omitempty"`
	// nodeName is the node the copy was restored on.
	// +optional
	// +kubebuilder:validation:MaxLength=253
	NodeName *string `json:"nodeName,omitempty"`
	// url is the snapshot's object.
	// +optional
	// +kubebuilder:validation:MaxLength=2048
	URL *string `json:"url,omitempty"`
	// snapshotTime is when the snapshot began.
	// +optional
	SnapshotTime *metav1.Time `json:"snapshotTime,omitempty"`
	// restoreTime is when the copy was made from it.
	// +optional
	RestoreTime *metav1.Time `json:"restoreTime,omitempty"`
	// ageSeconds is how old the snapshot was at restoreTime.
	// +optional
	// +kubebuilder:validation:Minimum=0
	AgeSeconds *int64 `json:"ageSeconds,omitempty"`
	// lostNode is the node whose loss made the restore necessary; unset
	// after a suspend.
	// +optional
	// +kubebuilder:validation:MaxLength=253
	LostNode *string `json:"lostNode,omitempty"`
	// lostTime is when lostNode was declared lost.
	// +optional
	LostTime *metav1.Time `json:"lostTime,omitempty"`
}

// ConditionWorkspaceRestored is a BashTask condition, True on the first
// task dispatched to a restored copy of its workspace, its message the
// notice in a sentence (status.workspaceRestore has the fields).
const ConditionWorkspaceRestored = "WorkspaceRestored"

// ReasonRestoredFromSnapshot is the reason of ConditionWorkspaceRestored.
const ReasonRestoredFromSnapshot = "RestoredFromSnapshot"

// BashWorkspace is a session's home on one node that the BashTasks naming
// it (spec.workspace) share: files, working directory, optionally the
// environment, and a network, isolated from every other owner.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=bw
// +kubebuilder:selectablefield:JSONPath=`.spec.owner`
// +kubebuilder:printcolumn:name="Phase",type=string,JSONPath=`.status.phase`
// +kubebuilder:printcolumn:name="Node",type=string,JSONPath=`.status.nodeName`
// +kubebuilder:printcolumn:name="Running",type=integer,JSONPath=`.status.runningTasks`
// +kubebuilder:printcolumn:name="Used",type=integer,JSONPath=`.status.usedBytes`
// +kubebuilder:printcolumn:name="Dir",type=string,JSONPath=`.status.workingDir`
// +kubebuilder:printcolumn:name="Snapshot",type=date,JSONPath=`.status.snapshot.time`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
// +kubebuilder:printcolumn:name="Owner",type=string,JSONPath=`.spec.owner`,priority=10
// +kubebuilder:printcolumn:name="UID",type=integer,JSONPath=`.status.runAsUser`,priority=10
type BashWorkspace struct {
	metav1.TypeMeta `json:",inline"`

	// metadata is the standard object metadata.
	// +optional
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// spec is the workspace asked for.
	// +required
	Spec BashWorkspaceSpec `json:"spec"`

	// status is what the controller observed.
	// +optional
	Status BashWorkspaceStatus `json:"status,omitempty,omitzero"`
}

// BashWorkspaceList is a list of BashWorkspaces.
//
// +kubebuilder:object:root=true
type BashWorkspaceList struct {
	metav1.TypeMeta `json:",inline"`
	// metadata is the standard list metadata.
	// +optional
	metav1.ListMeta `json:"metadata,omitempty"`
	// items are the workspaces.
	Items []BashWorkspace `json:"items"`
}
