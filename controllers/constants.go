package controllers

// Keys the controller puts on objects, and names of cache indexes. Every
// label, annotation, finalizer and index key of the controller is here.
const (
	// Finalizer keeps a task's object until its process is stopped and the
	// agent has forgotten it, so that deleting a running task cancels it and
	// never leaves an orphan on a node. A task carries it from its creation
	// (config/admission adds it; the controller does before dispatch on a
	// cluster without the policy) until it is deleted, finished or not:
	// removing it at the end would cost every task one more write.
	Finalizer = "bashtask.dev/finalizer"

	// WorkspaceFinalizer keeps a BashWorkspace's object until its agent
	// has stopped the workspace's running tasks and removed its directory,
	// network and UID lease, or until its node is known to be lost. The
	// controller adds it before it places the workspace.
	WorkspaceFinalizer = "bashtask.dev/workspace"

	// AnnotationArgoCDTrackingID is set by Argo CD on every resource it
	// tracks by annotation, the default tracking method since Argo CD 3.0.
	AnnotationArgoCDTrackingID = "argocd.argoproj.io/tracking-id"
	// LabelAppInstance is the label Argo CD can track resources by
	// (application.instanceLabelKey's default); Helm charts set it too.
	LabelAppInstance = "app.kubernetes.io/instance"
	// LabelFluxKustomizationName is set by Flux's kustomize-controller on
	// every resource a Kustomization applies.
	LabelFluxKustomizationName = "kustomize.toolkit.fluxcd.io/name"

	// IndexOwner indexes BashTasks by spec.owner, for the per-owner limit.
	IndexOwner = "spec.owner"

	// IndexWorkspace indexes BashTasks by spec.workspace, so that a
	// workspace's change wakes the tasks waiting for it.
	IndexWorkspace = "spec.workspace"

	// IndexWorkspaceNode indexes BashWorkspaces by status.nodeName, so
	// that a Node's deletion reaches the workspaces it held.
	IndexWorkspaceNode = "status.nodeName"

	// IndexRunningOwner indexes the BashTasks that occupy an agent's task
	// slot, from the write-ahead (dispatch) until terminal, by spec.owner
	// ("" for tasks without one), so that the fair turns count an
	// owner's running tasks without listing every task (see fairShare).
	IndexRunningOwner = "bashtask.dev/running-owner"

	// ManagedEnvName and the others below are the managed facts given to
	// every command, last in its environment so nothing displaces them
	// (docs/executor.md, "Environment, in order, later wins").
	ManagedEnvName      = "BASHTASK_NAME"
	ManagedEnvNamespace = "BASHTASK_NAMESPACE"
	ManagedEnvUID       = "BASHTASK_UID"
	ManagedEnvNode      = "BASHTASK_NODE"
)

// Condition reasons the controller writes. Terminal reasons are the
// api/v1alpha1 Reason values; these explain the non-terminal states.
const (
	// ReasonSuspended: spec.suspend is true and the task was not dispatched.
	ReasonSuspended = "Suspended"
	// ReasonPending: the task waits for its dispatch or for the agent to
	// start it (Reconciling and Ready).
	ReasonPending = "Pending"
	// ReasonRunning: the command runs (Reconciling and Ready).
	ReasonRunning = "Running"
	// ReasonMissingReference: a referenced Secret, ConfigMap or key does not
	// exist yet; the controller retries, like a Pod's config error.
	ReasonMissingReference = "MissingReference"
	// ReasonOwnerLimit: the owner already has --max-running-per-owner tasks
	// running.
	ReasonOwnerLimit = "OwnerLimit"
	// ReasonNoAgent: no ready agent matches the placement or has capacity.
	ReasonNoAgent = "NoAgent"
	// ReasonFairShare: an agent the task fits has a free slot, but tasks
	// waiting for it come first in the fair turns (their owners run fewer
	// tasks, or they waited longer; --fair-share); the task is woken when
	// its turn comes.
	ReasonFairShare = "FairShare"
	// ReasonNodeUnschedulable: every node the task may go to is cordoned,
	// not Ready, or has a NoSchedule or NoExecute taint the agent's
	// tolerations do not tolerate; the message names each node and why.
	// The task waits, as a pod would, and is dispatched when a node takes
	// work again.
	ReasonNodeUnschedulable = "NodeUnschedulable"
	// ReasonDispatched: the task is recorded on an agent (write-ahead).
	ReasonDispatched = "Dispatched"
	// ReasonStarted: the agent reported the command started.
	ReasonStarted = "Started"
	// ReasonFinished: the command is no longer running.
	ReasonFinished = "Finished"
	// ReasonUploadPending: an output stream is not yet in object storage.
	ReasonUploadPending = "UploadPending"
	// ReasonUploaded: every stream due for upload is stored.
	ReasonUploaded = "Uploaded"
	// ReasonNotNeeded: no stream needed uploading.
	ReasonNotNeeded = "NotNeeded"
	// ReasonWorkspaceNotFound: the task's spec.workspace names a
	// BashWorkspace that does not exist (yet); the task waits for it.
	ReasonWorkspaceNotFound = "WorkspaceNotFound"
	// ReasonWorkspaceNotReady: the task's workspace exists and is not
	// Ready yet; the task waits for it.
	ReasonWorkspaceNotReady = "WorkspaceNotReady"
	// ReasonIdleTimeout (an event): a workspace had no running task for
	// its spec.idleTimeoutSeconds and was deleted.
	ReasonIdleTimeout = "IdleTimeout"
	// ReasonKeptPastIdleTimeout (an event): a workspace's idle timeout is
	// due but a GitOps tool manages it, so it is not deleted.
	ReasonKeptPastIdleTimeout = "KeptPastIdleTimeout"
	// ReasonDeleted (an event): a workspace was removed from its node.
	ReasonDeleted = "Deleted"
	// ReasonDeletedWithoutAgent (an event): a workspace whose node is lost
	// was deleted without its agent; whatever is left on the node stays.
	ReasonDeletedWithoutAgent = "DeletedWithoutAgent"

	// ReasonKeptPastTTL (an event): the task's TTL is due but a GitOps tool
	// manages it, so it is not deleted.
	ReasonKeptPastTTL = "KeptPastTTL"
)
