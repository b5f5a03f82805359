package v1alpha1

import (
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Limits of the BashTask API. Each is enforced by the CRD schema and repeated
// here so that clients and the controller can check input before sending it.
const (
	// MaxCommandBytes is the largest spec.command in bytes. The command is one
	// argument of execve(2); Linux caps a single argument at MAX_ARG_STRLEN,
	// 131072 bytes including the terminating NUL.
	MaxCommandBytes = 131071

	// MaxStdinBytes is the largest inline spec.stdin in bytes (256 KiB).
	MaxStdinBytes = 262144

	// MaxEnvEntries is the largest number of spec.env entries.
	MaxEnvEntries = 256

	// MaxEnvValueBytes is the largest env value in bytes: an environment
	// string "NAME=value" is bounded by MAX_ARG_STRLEN like an argument.
	MaxEnvValueBytes = 131071

	// MaxTailBytes is the largest spec.output.tailBytes: the tail of each
	// stream kept in status, in bytes.
	MaxTailBytes = 262144

	// DefaultTailBytes is the tail kept per stream, in bytes, when
	// spec.output.tailBytes is unset.
	DefaultTailBytes = 64000

	// DefaultSpillLimitBytes is the per-stream spill file cap, in bytes, when
	// spec.output.spillLimitBytes is unset (64 MiB).
	DefaultSpillLimitBytes = 64 << 20

	// MaxSpillLimitBytes is the largest spec.output.spillLimitBytes (16 GiB):
	// a stream larger than this belongs in a Job that writes to storage itself.
	MaxSpillLimitBytes = 16 << 30

	// DefaultTimeoutSeconds is the timeout, in seconds, of a task that
	// sets neither spec.timeoutSeconds nor spec.timeoutMilliseconds (the
	// controller lowers it to its --max-timeout-seconds when that is
	// smaller).
	DefaultTimeoutSeconds = 120

	// MaxTimeoutSeconds is the largest spec.timeoutSeconds: 604800, a
	// week. The controller's --max-timeout-seconds may allow less.
	MaxTimeoutSeconds = 604800

	// MaxTimeoutMilliseconds is the largest spec.timeoutMilliseconds, the
	// same week as MaxTimeoutSeconds in milliseconds.
	MaxTimeoutMilliseconds = MaxTimeoutSeconds * 1000

	// DefaultStdinIdleTimeoutSeconds is spec.stdinStream.idleTimeoutSeconds
	// when unset.
	DefaultStdinIdleTimeoutSeconds = 60

	// DefaultKillGracePeriodSeconds is the grace period, in seconds, of a
	// task that sets neither spec.killGracePeriodSeconds nor
	// spec.killGracePeriodMilliseconds.
	DefaultKillGracePeriodSeconds = 3

	// MaxKillGracePeriodSeconds is the largest spec.killGracePeriodSeconds
	// (5 minutes).
	MaxKillGracePeriodSeconds = 300

	// MaxKillGracePeriodMilliseconds is the largest
	// spec.killGracePeriodMilliseconds, MaxKillGracePeriodSeconds in
	// milliseconds.
	MaxKillGracePeriodMilliseconds = MaxKillGracePeriodSeconds * 1000
)

// StdinStream configures a streamed standard input (spec.stdinStream).
type StdinStream struct {
	// idleTimeoutSeconds is how long, in seconds, the agent waits for the
	// next request on bashtasks/stdin (a write or an empty query) before it
	// closes the pipe and the command reads EOF, so a client that went
	// away cannot hold the task until its timeout in silence. The clock
	// runs from the start of the command and stops while a request is in
	// progress. Default 60, 1 to 86400 (a day).
	// +optional
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=86400
	// +default=60
	IdleTimeoutSeconds *int32 `json:"idleTimeoutSeconds,omitempty"`
}

// BashTaskSpec is what the user asks for: a command, its input, environment
// and placement. Every field except cancelRequested, suspend and
// ttlSecondsAfterFinished is immutable once the task exists.
//
// +kubebuilder:validation:XValidation:rule="!(has(self.stdin) && has(self.stdinFrom))",message="stdin and stdinFrom are mutually exclusive: set at most one"
// +kubebuilder:validation:XValidation:rule="has(self.stdin) == has(oldSelf.stdin)",message="spec.stdin is immutable (it cannot be added or removed): a task runs its command once. To run a new command, create a task with a new name; Argo CD does that with the sync options Force=true,Replace=true or a hook with hook-delete-policy BeforeHookCreation, Flux with the annotation kustomize.toolkit.fluxcd.io/force: enabled"
// +kubebuilder:validation:XValidation:rule="has(self.stdinFrom) == has(oldSelf.stdinFrom)",message="spec.stdinFrom is immutable (it cannot be added or removed): a task runs its command once. To run a new command, create a task with a new name; Argo CD does that with the sync options Force=true,Replace=true or a hook with hook-delete-policy BeforeHookCreation, Flux with the annotation kustomize.toolkit.fluxcd.io/force: enabled"
// +kubebuilder:validation:XValidation:rule="!(has(self.stdinStream) && (has(self.stdin) || has(self.stdinFrom)))",message="stdinStream is exclusive with stdin and stdinFrom: a streamed task takes its input only through bashtasks/stdin"
// +kubebuilder:validation:XValidation:rule="!(has(self.tty) && self.tty && (has(self.stdin) || has(self.stdinFrom) || has(self.stdinStream)))",message="spec.tty is exclusive with spec.stdin, spec.stdinFrom and spec.stdinStream: a task with a terminal takes its input through bashtasks/attach"
// +kubebuilder:validation:XValidation:rule="has(self.tty) == has(oldSelf.tty)",message="spec.tty is immutable (it cannot be added or removed): a task runs its command once. To run a new command, create a task with a new name; Argo CD does that with the sync options Force=true,Replace=true or a hook with hook-delete-policy BeforeHookCreation, Flux with the annotation kustomize.toolkit.fluxcd.io/force: enabled"
// +kubebuilder:validation:XValidation:rule="has(self.stdinStream) == has(oldSelf.stdinStream)",message="spec.stdinStream is immutable (it cannot be added or removed): a task runs its command once. To run a new command, create a task with a new name; Argo CD does that with the sync options Force=true,Replace=true or a hook with hook-delete-policy BeforeHookCreation, Flux with the annotation kustomize.toolkit.fluxcd.io/force: enabled"
// +kubebuilder:validation:XValidation:rule="has(self.env) == has(oldSelf.env)",message="spec.env is immutable (it cannot be added or removed): a task runs its command once. To run a new command, create a task with a new name; Argo CD does that with the sync options Force=true,Replace=true or a hook with hook-delete-policy BeforeHookCreation, Flux with the annotation kustomize.toolkit.fluxcd.io/force: enabled"
// +kubebuilder:validation:XValidation:rule="has(self.owner) == has(oldSelf.owner)",message="spec.owner is immutable (it cannot be added or removed): a task runs its command once. To run a new command, create a task with a new name; Argo CD does that with the sync options Force=true,Replace=true or a hook with hook-delete-policy BeforeHookCreation, Flux with the annotation kustomize.toolkit.fluxcd.io/force: enabled"
// +kubebuilder:validation:XValidation:rule="has(self.workingDir) == has(oldSelf.workingDir)",message="spec.workingDir is immutable (it cannot be added or removed): a task runs its command once. To run a new command, create a task with a new name; Argo CD does that with the sync options Force=true,Replace=true or a hook with hook-delete-policy BeforeHookCreation, Flux with the annotation kustomize.toolkit.fluxcd.io/force: enabled"
// +kubebuilder:validation:XValidation:rule="has(self.timeoutSeconds) == has(oldSelf.timeoutSeconds)",message="spec.timeoutSeconds is immutable (it cannot be added or removed): a task runs its command once. To run a new command, create a task with a new name; Argo CD does that with the sync options Force=true,Replace=true or a hook with hook-delete-policy BeforeHookCreation, Flux with the annotation kustomize.toolkit.fluxcd.io/force: enabled"
// +kubebuilder:validation:XValidation:rule="has(self.killGracePeriodSeconds) == has(oldSelf.killGracePeriodSeconds)",message="spec.killGracePeriodSeconds is immutable (it cannot be added or removed): a task runs its command once. To run a new command, create a task with a new name; Argo CD does that with the sync options Force=true,Replace=true or a hook with hook-delete-policy BeforeHookCreation, Flux with the annotation kustomize.toolkit.fluxcd.io/force: enabled"
// +kubebuilder:validation:XValidation:rule="has(self.timeoutMilliseconds) == has(oldSelf.timeoutMilliseconds)",message="spec.timeoutMilliseconds is immutable (it cannot be added or removed): a task runs its command once. To run a new command, create a task with a new name; Argo CD does that with the sync options Force=true,Replace=true or a hook with hook-delete-policy BeforeHookCreation, Flux with the annotation kustomize.toolkit.fluxcd.io/force: enabled"
// +kubebuilder:validation:XValidation:rule="has(self.killGracePeriodMilliseconds) == has(oldSelf.killGracePeriodMilliseconds)",message="spec.killGracePeriodMilliseconds is immutable (it cannot be added or removed): a task runs its command once. To run a new command, create a task with a new name; Argo CD does that with the sync options Force=true,Replace=true or a hook with hook-delete-policy BeforeHookCreation, Flux with the annotation kustomize.toolkit.fluxcd.io/force: enabled"
// +kubebuilder:validation:XValidation:rule="!(has(self.timeoutSeconds) && has(self.timeoutMilliseconds))",message="timeoutSeconds and timeoutMilliseconds are mutually exclusive: set at most one (timeoutMilliseconds for a limit that is not a whole number of seconds)"
// +kubebuilder:validation:XValidation:rule="!(has(self.killGracePeriodSeconds) && has(self.killGracePeriodMilliseconds))",message="killGracePeriodSeconds and killGracePeriodMilliseconds are mutually exclusive: set at most one (killGracePeriodMilliseconds for a grace period that is not a whole number of seconds)"
// +kubebuilder:validation:XValidation:rule="has(self.output) == has(oldSelf.output)",message="spec.output is immutable (it cannot be added or removed): a task runs its command once. To run a new command, create a task with a new name; Argo CD does that with the sync options Force=true,Replace=true or a hook with hook-delete-policy BeforeHookCreation, Flux with the annotation kustomize.toolkit.fluxcd.io/force: enabled"
// +kubebuilder:validation:XValidation:rule="has(self.nodeName) == has(oldSelf.nodeName)",message="spec.nodeName is immutable (it cannot be added or removed): a task runs its command once. To run a new command, create a task with a new name; Argo CD does that with the sync options Force=true,Replace=true or a hook with hook-delete-policy BeforeHookCreation, Flux with the annotation kustomize.toolkit.fluxcd.io/force: enabled"
// +kubebuilder:validation:XValidation:rule="has(self.nodeSelector) == has(oldSelf.nodeSelector)",message="spec.nodeSelector is immutable (it cannot be added or removed): a task runs its command once. To run a new command, create a task with a new name; Argo CD does that with the sync options Force=true,Replace=true or a hook with hook-delete-policy BeforeHookCreation, Flux with the annotation kustomize.toolkit.fluxcd.io/force: enabled"
// +kubebuilder:validation:XValidation:rule="has(self.resources) == has(oldSelf.resources)",message="spec.resources is immutable (it cannot be added or removed): a task runs its command once. To run a new command, create a task with a new name; Argo CD does that with the sync options Force=true,Replace=true or a hook with hook-delete-policy BeforeHookCreation, Flux with the annotation kustomize.toolkit.fluxcd.io/force: enabled"
// +kubebuilder:validation:XValidation:rule="has(self.network) == has(oldSelf.network)",message="spec.network is immutable (it cannot be added or removed): a task runs its command once. To run a new command, create a task with a new name; Argo CD does that with the sync options Force=true,Replace=true or a hook with hook-delete-policy BeforeHookCreation, Flux with the annotation kustomize.toolkit.fluxcd.io/force: enabled"
// +kubebuilder:validation:XValidation:rule="has(self.workspace) == has(oldSelf.workspace)",message="spec.workspace is immutable (it cannot be added or removed): a task runs its command once. To run a new command, create a task with a new name; Argo CD does that with the sync options Force=true,Replace=true or a hook with hook-delete-policy BeforeHookCreation, Flux with the annotation kustomize.toolkit.fluxcd.io/force: enabled"
// +kubebuilder:validation:XValidation:rule="!has(self.workspace) || (!has(self.nodeName) && !has(self.nodeSelector))",message="spec.nodeName and spec.nodeSelector must be unset with spec.workspace: the task runs on the workspace's node"
// +kubebuilder:validation:XValidation:rule="!has(self.workspace) || (!has(self.image) && !has(self.imagePullSecrets))",message="spec.image and spec.imagePullSecrets must be unset with spec.workspace: the task runs in the workspace's image (its spec.image)"
// +kubebuilder:validation:XValidation:rule="has(self.image) == has(oldSelf.image)",message="spec.image is immutable (it cannot be added or removed): a task runs its command once. To run a new command, create a task with a new name; Argo CD does that with the sync options Force=true,Replace=true or a hook with hook-delete-policy BeforeHookCreation, Flux with the annotation kustomize.toolkit.fluxcd.io/force: enabled"
// +kubebuilder:validation:XValidation:rule="!has(self.egress) || (!has(self.workspace) && has(self.network) && self.network == 'Egress')",message="spec.egress needs spec.network Egress and no spec.workspace (a workspace's tasks follow its spec.egress)"
// +kubebuilder:validation:XValidation:rule="!has(self.egress) || !has(self.egress.inject)",message="spec.egress.inject needs a BashWorkspace: a workspace's tasks get its CA in their trust store"
// +kubebuilder:validation:XValidation:rule="has(self.egress) == has(oldSelf.egress)",message="spec.egress is immutable (it cannot be added or removed): a task runs its command once; a workspace's spec.egress may change"
// +kubebuilder:validation:XValidation:rule="!has(self.workspace) || !has(self.network)",message="spec.network must be unset with spec.workspace: the task gets the workspace's network (its spec.network)"
// +kubebuilder:validation:XValidation:rule="!has(self.workspace) || !has(self.resources) || !has(self.resources.ephemeralStorage)",message="spec.resources.ephemeralStorage must be unset with spec.workspace: the task writes to the workspace, whose size is its spec.storage"
// +kubebuilder:validation:XValidation:rule="!has(self.workingDir) || has(self.workspace) || self.workingDir.startsWith('/')",message="workingDir must be an absolute path (start with /); with spec.workspace it may also be relative to the workspace's root"
// +kubebuilder:validation:XValidation:rule="!has(oldSelf.cancelRequested) || !oldSelf.cancelRequested || (has(self.cancelRequested) && self.cancelRequested)",message="cancelRequested cannot be unset once it is true: cancellation is one-way"
type BashTaskSpec struct {
	// command is the string given to `bash -c`, 1 to 131071 bytes (the
	// kernel's per-argument limit, MAX_ARG_STRLEN less the NUL). It must not
	// contain a NUL byte. Immutable.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=131071
	// +kubebuilder:validation:XValidation:rule="size(bytes(self)) <= 131071",message="command must be at most 131071 bytes (the kernel's per-argument limit)"
	// +kubebuilder:validation:XValidation:rule="!self.contains('\\u0000')",message="command must not contain a NUL byte"
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="spec.command is immutable: a task runs its command once. To run a new command, create a task with a new name; Argo CD does that with the sync options Force=true,Replace=true or a hook with hook-delete-policy BeforeHookCreation, Flux with the annotation kustomize.toolkit.fluxcd.io/force: enabled"
	Command string `json:"command,omitempty"`

	// stdin is written to the command's standard input, which is then closed.
	// Unset: standard input is /dev/null. Empty string: an empty pipe. At most
	// 262144 bytes of UTF-8 text. Exclusive with stdinFrom. Immutable.
	// +optional
	// +kubebuilder:validation:MaxLength=262144
	// +kubebuilder:validation:XValidation:rule="size(bytes(self)) <= 262144",message="stdin must be at most 262144 bytes"
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="spec.stdin is immutable: a task runs its command once. To run a new command, create a task with a new name; Argo CD does that with the sync options Force=true,Replace=true or a hook with hook-delete-policy BeforeHookCreation, Flux with the annotation kustomize.toolkit.fluxcd.io/force: enabled"
	Stdin *string `json:"stdin,omitempty"`

	// stdinFrom takes standard input from a key of a Secret or ConfigMap in
	// the task's namespace, resolved by the controller before dispatch.
	// Exclusive with stdin. Immutable.
	// +optional
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="spec.stdinFrom is immutable: a task runs its command once. To run a new command, create a task with a new name; Argo CD does that with the sync options Force=true,Replace=true or a hook with hook-delete-policy BeforeHookCreation, Flux with the annotation kustomize.toolkit.fluxcd.io/force: enabled"
	StdinFrom *ValueSource `json:"stdinFrom,omitempty"`

	// stdinStream makes the command's standard input a pipe that the
	// output API feeds while the task runs: bytes arrive through POST on
	// the bashtasks/stdin subresource of output.bashtask.dev (docs/stdin.md),
	// in order and exactly once by input offset, and closing it gives the
	// command EOF. Exclusive with stdin and stdinFrom. Immutable.
	// +optional
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="spec.stdinStream is immutable: a task runs its command once. To run a new command, create a task with a new name; Argo CD does that with the sync options Force=true,Replace=true or a hook with hook-delete-policy BeforeHookCreation, Flux with the annotation kustomize.toolkit.fluxcd.io/force: enabled"
	StdinStream *StdinStream `json:"stdinStream,omitempty"`

	// tty gives the command a terminal, as a container's tty does: its
	// standard input, output and error are one pseudo-terminal on the
	// node, its controlling terminal, and what the terminal shows is the
	// task's stdout (stderr stays empty). Input and window sizes come
	// through the bashtasks/attach subresource of output.bashtask.dev
	// (docs/output.md, "A terminal"). Exclusive with stdin, stdinFrom and
	// stdinStream. Immutable.
	// +optional
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="spec.tty is immutable: a task runs its command once. To run a new command, create a task with a new name; Argo CD does that with the sync options Force=true,Replace=true or a hook with hook-delete-policy BeforeHookCreation, Flux with the annotation kustomize.toolkit.fluxcd.io/force: enabled"
	TTY *bool `json:"tty,omitempty"`

	// env lists environment variables for the command, the shape of a
	// container's env. Explicit entries win over the agent's ambient
	// environment, even when a name looks like a credential; names starting
	// with BASHTASK_ are overridden by the values the operator manages.
	// At most 256 entries with unique names. Immutable.
	// +optional
	// +listType=map
	// +listMapKey=name
	// +kubebuilder:validation:MaxItems=256
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="spec.env is immutable: a task runs its command once. To run a new command, create a task with a new name; Argo CD does that with the sync options Force=true,Replace=true or a hook with hook-delete-policy BeforeHookCreation, Flux with the annotation kustomize.toolkit.fluxcd.io/force: enabled"
	Env []EnvVar `json:"env,omitempty"`

	// owner is an opaque token naming who the task belongs to, such as an
	// agent session or a pipeline run. The operator only interprets it for the
	// per-owner concurrency limit and the fair turns of task slots. Selectable:
	// `kubectl get bt --field-selector spec.owner=X`. 1 to 253 characters.
	// Immutable.
	// +optional
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="spec.owner is immutable: a task runs its command once. To run a new command, create a task with a new name; Argo CD does that with the sync options Force=true,Replace=true or a hook with hook-delete-policy BeforeHookCreation, Flux with the annotation kustomize.toolkit.fluxcd.io/force: enabled"
	Owner *string `json:"owner,omitempty"`

	// workingDir is the absolute directory the command starts in. Unset: a
	// fresh per-task directory owned by the task's user. With
	// spec.workspace it is resolved inside the workspace and cannot leave
	// it: a relative path is taken from the workspace's root, an absolute
	// one with the root as "/"; unset there means the workspace's carried
	// directory. At most 4095 bytes (PATH_MAX less the NUL). Immutable.
	// +optional
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=4095
	// +kubebuilder:validation:XValidation:rule="!self.contains('\\u0000')",message="workingDir must not contain a NUL byte"
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="spec.workingDir is immutable: a task runs its command once. To run a new command, create a task with a new name; Argo CD does that with the sync options Force=true,Replace=true or a hook with hook-delete-policy BeforeHookCreation, Flux with the annotation kustomize.toolkit.fluxcd.io/force: enabled"
	WorkingDir *string `json:"workingDir,omitempty"`

	// timeoutSeconds is the wall-clock limit of the run in seconds, measured
	// by the agent on a monotonic clock from the start of the process, 1 to
	// 604800 (a week). A value over the controller's --max-timeout-seconds
	// (600 by default) ends the task InvalidSpec before it is dispatched;
	// it is never cut short. Exclusive with timeoutMilliseconds; when both
	// are unset the timeout is 120 seconds (or the controller's cap, when
	// lower). Immutable.
	// +optional
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=604800
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="spec.timeoutSeconds is immutable: a task runs its command once. To run a new command, create a task with a new name; Argo CD does that with the sync options Force=true,Replace=true or a hook with hook-delete-policy BeforeHookCreation, Flux with the annotation kustomize.toolkit.fluxcd.io/force: enabled"
	TimeoutSeconds *int32 `json:"timeoutSeconds,omitempty"`

	// timeoutMilliseconds is timeoutSeconds in milliseconds, for a limit
	// under a second or between two whole seconds: 1 to 604800000 (a
	// week). The same rules hold: measured by the agent on a monotonic
	// clock, refused over the controller's --max-timeout-seconds.
	// Exclusive with timeoutSeconds. Immutable.
	// +optional
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=604800000
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="spec.timeoutMilliseconds is immutable: a task runs its command once. To run a new command, create a task with a new name; Argo CD does that with the sync options Force=true,Replace=true or a hook with hook-delete-policy BeforeHookCreation, Flux with the annotation kustomize.toolkit.fluxcd.io/force: enabled"
	TimeoutMilliseconds *int32 `json:"timeoutMilliseconds,omitempty"`

	// killGracePeriodSeconds is the time in seconds between SIGTERM and
	// SIGKILL when the task is stopped (timeout, cancel, deletion, leftover
	// processes), 0 to 300; 0 sends SIGKILL right after SIGTERM. Exclusive
	// with killGracePeriodMilliseconds; when both are unset the grace
	// period is 3 seconds. Immutable.
	// +optional
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=300
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="spec.killGracePeriodSeconds is immutable: a task runs its command once. To run a new command, create a task with a new name; Argo CD does that with the sync options Force=true,Replace=true or a hook with hook-delete-policy BeforeHookCreation, Flux with the annotation kustomize.toolkit.fluxcd.io/force: enabled"
	KillGracePeriodSeconds *int32 `json:"killGracePeriodSeconds,omitempty"`

	// killGracePeriodMilliseconds is killGracePeriodSeconds in
	// milliseconds, for a grace period under a second or between two whole
	// seconds: 0 to 300000 (5 minutes). Exclusive with
	// killGracePeriodSeconds. Immutable.
	// +optional
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=300000
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="spec.killGracePeriodMilliseconds is immutable: a task runs its command once. To run a new command, create a task with a new name; Argo CD does that with the sync options Force=true,Replace=true or a hook with hook-delete-policy BeforeHookCreation, Flux with the annotation kustomize.toolkit.fluxcd.io/force: enabled"
	KillGracePeriodMilliseconds *int32 `json:"killGracePeriodMilliseconds,omitempty"`

	// output controls how much output is kept in status, on the node and in
	// object storage. Immutable.
	// +optional
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="spec.output is immutable: a task runs its command once. To run a new command, create a task with a new name; Argo CD does that with the sync options Force=true,Replace=true or a hook with hook-delete-policy BeforeHookCreation, Flux with the annotation kustomize.toolkit.fluxcd.io/force: enabled"
	Output *OutputSpec `json:"output,omitempty"`

	// nodeName runs the task on the agent of this node. Immutable.
	// +optional
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="spec.nodeName is immutable: a task runs its command once. To run a new command, create a task with a new name; Argo CD does that with the sync options Force=true,Replace=true or a hook with hook-delete-policy BeforeHookCreation, Flux with the annotation kustomize.toolkit.fluxcd.io/force: enabled"
	NodeName *string `json:"nodeName,omitempty"`

	// nodeSelector runs the task on an agent whose Node carries all of these
	// labels. At most 32 entries. Immutable.
	// +optional
	// +kubebuilder:validation:MaxProperties=32
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="spec.nodeSelector is immutable: a task runs its command once. To run a new command, create a task with a new name; Argo CD does that with the sync options Force=true,Replace=true or a hook with hook-delete-policy BeforeHookCreation, Flux with the annotation kustomize.toolkit.fluxcd.io/force: enabled"
	NodeSelector map[string]string `json:"nodeSelector,omitempty"`

	// resources limits memory, CPU and process count through the task's
	// cgroup, where the node delegates those controllers, and the size of
	// its working directory; status.isolation says whether they were
	// enforced. Immutable.
	// +optional
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="spec.resources is immutable: a task runs its command once. To run a new command, create a task with a new name; Argo CD does that with the sync options Force=true,Replace=true or a hook with hook-delete-policy BeforeHookCreation, Flux with the annotation kustomize.toolkit.fluxcd.io/force: enabled"
	Resources *ResourceLimits `json:"resources,omitempty"`

	// network is the network the task reaches: Node (whatever the agent's
	// pod reaches, including a cloud's metadata address and the cluster's
	// Services), None (a network namespace of its own with only loopback
	// up) or Egress (a network namespace of its own with a NATed IPv4 route
	// out that reaches neither the node's addresses, link-local addresses,
	// the ranges the agent denies nor other tasks; DNS through the agent's
	// resolvers). None and Egress need an agent at the tenant isolation
	// level. Unset means the agent's default (its --task-network: Egress at
	// the tenant level). An agent runs only the networks of its
	// --allowed-networks (Egress and None at the tenant level unless Node
	// is opted in): another ends InvalidSpec. Immutable.
	// +optional
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="spec.network is immutable: a task runs its command once. To run a new command, create a task with a new name; Argo CD does that with the sync options Force=true,Replace=true or a hook with hook-delete-policy BeforeHookCreation, Flux with the annotation kustomize.toolkit.fluxcd.io/force: enabled"
	Network *TaskNetwork `json:"network,omitempty"`

	// egress limits the domain names the task reaches (docs/egress.md):
	// needs network Egress and no workspace (a workspace's tasks follow
	// its spec.egress). Unset: no limit by name. Immutable.
	// +optional
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="spec.egress of a BashTask is immutable: a workspace's spec.egress is the one that may change"
	Egress *EgressPolicy `json:"egress,omitempty"`

	// workspace names a BashWorkspace in the task's namespace to run in:
	// as its UID, in its network, with its HOME, starting in the directory
	// its last task ended in. The workspace's spec.owner, when set, must
	// equal this task's spec.owner (else InvalidSpec naming both). A task
	// naming a workspace that does not exist yet, or is not Ready yet
	// (being placed, made, or restored; one suspended by its idle timeout
	// is restored for the task), stays Pending with the Scheduled
	// condition saying what it waits for, so that a GitOps apply of both
	// works in any order. A workspace whose spec.suspend is true, or that
	// is NodeLost or Failed, takes no task: the task ends
	// WorkspaceUnavailable at once. nodeName, nodeSelector, network and
	// resources.ephemeralStorage must be unset. A DNS subdomain of at most
	// 253 characters. Immutable.
	// +optional
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$`
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="spec.workspace is immutable: a task runs its command once. To run a new command, create a task with a new name; Argo CD does that with the sync options Force=true,Replace=true or a hook with hook-delete-policy BeforeHookCreation, Flux with the annotation kustomize.toolkit.fluxcd.io/force: enabled"
	Workspace *string `json:"workspace,omitempty"`

	// image is the OCI image whose file system the task runs in, for a
	// task without a workspace: its layers are the read-only lower layers
	// of the task's root, and what it writes outside its working
	// directory goes away with it (docs/images.md). A workspace task runs
	// in its workspace's image: this must be unset with spec.workspace.
	// Unset: the agent's default image (--default-image), or the node's
	// root file system when the agent has none. Immutable.
	// +optional
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="spec.image is immutable: a task runs its command once. To run a new command, create a task with a new name; Argo CD does that with the sync options Force=true,Replace=true or a hook with hook-delete-policy BeforeHookCreation, Flux with the annotation kustomize.toolkit.fluxcd.io/force: enabled"
	Image *ImageReference `json:"image,omitempty"`

	// imagePullSecrets names Secrets of type
	// kubernetes.io/dockerconfigjson in the task's namespace whose
	// credentials pull spec.image, as a pod's spec.imagePullSecrets. At
	// most 16; unset with spec.workspace (the workspace's own apply).
	// Immutable.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=16
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="spec.imagePullSecrets is immutable: a task runs its command once. To run a new command, create a task with a new name; Argo CD does that with the sync options Force=true,Replace=true or a hook with hook-delete-policy BeforeHookCreation, Flux with the annotation kustomize.toolkit.fluxcd.io/force: enabled"
	ImagePullSecrets []ImagePullSecret `json:"imagePullSecrets,omitempty"`

	// cancelRequested stops the task when set to true: SIGTERM, the grace
	// period, then SIGKILL, and the reason Cancelled. It can only go from
	// unset or false to true. Setting it on a finished task changes nothing.
	// +optional
	CancelRequested *bool `json:"cancelRequested,omitempty"`

	// suspend keeps the task from being dispatched while true, so that a
	// queueing system can gate it. It has no effect once the task has been
	// dispatched.
	// +optional
	Suspend *bool `json:"suspend,omitempty"`

	// ttlSecondsAfterFinished deletes the task this many seconds after it
	// finished. Unset: the controller's default, if any; otherwise kept.
	// +optional
	// +kubebuilder:validation:Minimum=0
	TTLSecondsAfterFinished *int32 `json:"ttlSecondsAfterFinished,omitempty"`
}

// EnvVar is one environment variable of the command: a literal value or a
// reference to a Secret or ConfigMap key in the task's namespace.
//
// +kubebuilder:validation:XValidation:rule="has(self.value) != has(self.valueFrom)",message="an env entry must set exactly one of value and valueFrom"
type EnvVar struct {
	// name of the variable: 1 to 1024 characters, no '=' and no NUL byte
	// (execve(2) splits NAME=value at the first '=' and ends it at a NUL).
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=1024
	// +kubebuilder:validation:XValidation:rule="!self.contains('=')",message="env name must not contain '='"
	// +kubebuilder:validation:XValidation:rule="!self.contains('\\u0000')",message="env name must not contain a NUL byte"
	Name string `json:"name,omitempty"`

	// value of the variable, at most 131071 bytes (the kernel's per-string
	// limit) and without NUL bytes. The NUL rule is a pattern rather than a
	// CEL rule because CEL's cost budget, multiplied by 256 entries of this
	// length, would exceed the API server's per-rule limit.
	// +optional
	// +kubebuilder:validation:MaxLength=131071
	// +kubebuilder:validation:Pattern=`^[^\x00]*$`
	Value *string `json:"value,omitempty"`

	// valueFrom takes the value from a Secret or ConfigMap key in the task's
	// namespace. The controller resolves it before dispatch and waits, with a
	// condition, while the object or key does not exist.
	// +optional
	ValueFrom *ValueSource `json:"valueFrom,omitempty"`
}

// ValueSource names one key of a Secret or of a ConfigMap in the task's
// namespace.
//
// +kubebuilder:validation:XValidation:rule="has(self.secretKeyRef) != has(self.configMapKeyRef)",message="set exactly one of secretKeyRef and configMapKeyRef"
type ValueSource struct {
	// secretKeyRef selects a key of a Secret.
	// +optional
	SecretKeyRef *KeySelector `json:"secretKeyRef,omitempty"`

	// configMapKeyRef selects a key of a ConfigMap.
	// +optional
	ConfigMapKeyRef *KeySelector `json:"configMapKeyRef,omitempty"`
}

// KeySelector names a key of a Secret or ConfigMap in the task's namespace.
type KeySelector struct {
	// name of the Secret or ConfigMap, a DNS subdomain of at most 253
	// characters.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	Name string `json:"name,omitempty"`

	// key within the object's data, at most 253 characters of
	// [-._a-zA-Z0-9] (the Secret and ConfigMap key rule).
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:Pattern=`^[-._a-zA-Z0-9]+$`
	Key string `json:"key,omitempty"`
}

// UploadPolicy says when a stream's spill file is uploaded to object storage.
//
// +kubebuilder:validation:Enum=WhenIncomplete;Always;Never
type UploadPolicy string

const (
	// UploadWhenIncomplete uploads a stream only when the tail in status is
	// not the whole stream.
	UploadWhenIncomplete UploadPolicy = "WhenIncomplete"
	// UploadAlways uploads every stream, even an empty one.
	UploadAlways UploadPolicy = "Always"
	// UploadNever keeps output on the node only until the task is forgotten.
	UploadNever UploadPolicy = "Never"
)

// OutputSpec controls output retention for each of stdout and stderr.
type OutputSpec struct {
	// tailBytes is how many trailing bytes of each stream are kept in
	// status, at most 262144. Unset: 64000.
	// +optional
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=262144
	TailBytes *int32 `json:"tailBytes,omitempty"`

	// spillLimitBytes caps the spill file of each stream on the node, in
	// bytes, at most 17179869184 (16 GiB). Bytes past the limit still count in
	// totalBytes and sha256. Unset: 67108864 (64 MiB).
	// +optional
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=17179869184
	SpillLimitBytes *int64 `json:"spillLimitBytes,omitempty"`

	// upload says when the spill file goes to object storage. Unset:
	// WhenIncomplete.
	// +optional
	Upload *UploadPolicy `json:"upload,omitempty"`
}

// ResourceLimits are the cgroup v2 limits of one task.
type ResourceLimits struct {
	// memory is the memory limit (memory.max), a positive quantity such as
	// 64Mi. Exceeding it kills the whole task with the reason OOMKilled.
	// +optional
	// +kubebuilder:validation:XValidation:rule="quantity(string(self)).isGreaterThan(quantity('0'))",message="resources.memory must be greater than zero"
	Memory *resource.Quantity `json:"memory,omitempty"`

	// cpu is the CPU bandwidth limit (cpu.max), a positive quantity such as
	// 500m.
	// +optional
	// +kubebuilder:validation:XValidation:rule="quantity(string(self)).isGreaterThan(quantity('0'))",message="resources.cpu must be greater than zero"
	CPU *resource.Quantity `json:"cpu,omitempty"`

	// pids is the largest number of processes and threads (pids.max), 1 to
	// 4194304 (PID_MAX_LIMIT on 64-bit Linux).
	// +optional
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=4194304
	PIDs *int64 `json:"pids,omitempty"`

	// ephemeralStorage is the size of the task's fresh working directory
	// at the tenant isolation level, a quantity from 32Mi (the smallest
	// file system the agent makes) to 16Ti, such as 2Gi: a write past it
	// fails with "No space left on device" in this task only. Unset means
	// the agent's default (--task-disk-size, 10Gi in the chart); above
	// the agent's cap (--task-disk-cap) the task ends InvalidSpec. Named
	// after the container resource; not a cgroup limit, and without effect
	// on a working directory named in spec.workingDir or at the process
	// level. status.isolation says when the node could not enforce it.
	// +optional
	// +kubebuilder:validation:XValidation:rule="quantity(string(self)).compareTo(quantity('32Mi')) >= 0",message="resources.ephemeralStorage must be at least 32Mi"
	// +kubebuilder:validation:XValidation:rule="quantity(string(self)).compareTo(quantity('16Ti')) <= 0",message="resources.ephemeralStorage must be at most 16Ti"
	EphemeralStorage *resource.Quantity `json:"ephemeralStorage,omitempty"`
}

// Phase is a summary of where a task is in its life, mirroring its
// conditions for printer columns and simple polling.
//
// +kubebuilder:validation:Enum=Pending;Running;Succeeded;Failed
type Phase string

const (
	// PhasePending means the task has not started: it waits for placement,
	// for referenced values, for the per-owner limit or for suspend to clear.
	PhasePending Phase = "Pending"
	// PhaseRunning means the agent started the command.
	PhaseRunning Phase = "Running"
	// PhaseSucceeded means the command exited 0 (reason Succeeded).
	PhaseSucceeded Phase = "Succeeded"
	// PhaseFailed means the task ended for any other reason.
	PhaseFailed Phase = "Failed"
)

// Reason is the terminal reason of a task, from a closed set. Exactly one is
// ever written; the first cause wins.
//
// +kubebuilder:validation:Enum=Succeeded;NonZeroExit;Signaled;TimedOut;Cancelled;OOMKilled;StartFailed;AgentRestarted;AgentLost;InvalidSpec;WorkspaceUnavailable;ImageNotFound;ImageUnauthorized;ImageUnsupported;ImageTooLarge;ImageShellMissing
type Reason string

const (
	// ReasonSucceeded means the shell exited 0.
	ReasonSucceeded Reason = "Succeeded"
	// ReasonNonZeroExit means the shell exited with a non-zero code.
	ReasonNonZeroExit Reason = "NonZeroExit"
	// ReasonSignaled means the shell was killed by a signal the operator did
	// not send.
	ReasonSignaled Reason = "Signaled"
	// ReasonTimedOut means the agent's deadline passed, whatever the exit code.
	ReasonTimedOut Reason = "TimedOut"
	// ReasonCancelled means cancelRequested or deletion stopped the task.
	ReasonCancelled Reason = "Cancelled"
	// ReasonOOMKilled means the kernel killed the task for exceeding its
	// memory limit.
	ReasonOOMKilled Reason = "OOMKilled"
	// ReasonStartFailed means the agent could not start the command (missing
	// working directory or shell, argument too long, invalid environment).
	ReasonStartFailed Reason = "StartFailed"
	// ReasonAgentRestarted means the agent restarted while the task ran; the
	// output captured until then is kept.
	ReasonAgentRestarted Reason = "AgentRestarted"
	// ReasonAgentLost means the task's agent was unreachable for longer than
	// the controller's --agent-lost-after.
	ReasonAgentLost Reason = "AgentLost"
	// ReasonInvalidSpec means the controller rejected the spec for a rule the
	// schema cannot express.
	ReasonInvalidSpec Reason = "InvalidSpec"
	// ReasonWorkspaceUnavailable means the task was not dispatched because
	// its workspace (spec.workspace) takes no task: spec.suspend holds it,
	// or it is NodeLost or Failed. The message names the workspace and
	// what would let a new task run (for a hold: `kubectl bashtask
	// workspace resume`, or spec.suspend set to false).
	ReasonWorkspaceUnavailable Reason = "WorkspaceUnavailable"
)

// Condition types of a BashTask, in the Job vocabulary. Each condition is
// stamped with the observedGeneration it was computed for.
const (
	// ConditionScheduled is True once the task is assigned to an agent and
	// recorded (write-ahead) before dispatch; False with a reason while it
	// waits for an agent, for referenced values or for the per-owner limit.
	ConditionScheduled = "Scheduled"
	// ConditionRunning is True while the command runs.
	ConditionRunning = "Running"
	// ConditionComplete is True when the command succeeded.
	ConditionComplete = "Complete"
	// ConditionFailed is True when the task ended with any reason other than
	// Succeeded.
	ConditionFailed = "Failed"
	// ConditionOutputUploaded is True when every stream due for upload is in
	// object storage, False while an upload is pending or retrying.
	ConditionOutputUploaded = "OutputUploaded"
	// ConditionLimitsEnforced, set on a task with spec.resources from its
	// dispatch on, is True when its node enforces every limit it asks
	// for and False, with the reason NotEnforced and a message naming
	// the limits, when the node enforces some not (isolation.limitsNotEnforced).
	ConditionLimitsEnforced = "LimitsEnforced"
)

// Condition types of a BashTask in the kstatus vocabulary
// (sigs.k8s.io/cli-utils/pkg/kstatus), which Flux, cli-utils appliers and
// kubectl-based tools read. Every status write carries them, and Reconciling
// and Stalled are never True together.
const (
	// ConditionReady is True when the command succeeded and False otherwise,
	// with the reason Pending, Suspended or Running while the task has not
	// finished, or the terminal reason after a failure.
	ConditionReady = "Ready"
	// ConditionReconciling is True, with the reason Pending, Suspended or
	// Running, while the task has not finished; absent once it has.
	ConditionReconciling = "Reconciling"
	// ConditionStalled is True, with the terminal reason and message, when
	// the task ended with any reason other than Succeeded; absent otherwise.
	ConditionStalled = "Stalled"
)

// IsolationMechanism names how the agent contained and killed the task.
//
// +kubebuilder:validation:Enum=cgroup;processGroup
type IsolationMechanism string

const (
	// IsolationCgroup means a cgroup v2 per task: every descendant, even one
	// that left the process group with setsid, is killed with the task.
	IsolationCgroup IsolationMechanism = "cgroup"
	// IsolationProcessGroup means the node offered no writable cgroup v2: the
	// task was signalled through its process group only and resource limits
	// were not enforced.
	IsolationProcessGroup IsolationMechanism = "processGroup"
)

// ResourceLimitName names one limit of spec.resources.
//
// +kubebuilder:validation:Enum=memory;cpu;pids;ephemeralStorage
type ResourceLimitName string

// The limits of spec.resources, by field name.
const (
	// LimitMemory is spec.resources.memory.
	LimitMemory ResourceLimitName = "memory"
	// LimitCPU is spec.resources.cpu.
	LimitCPU ResourceLimitName = "cpu"
	// LimitPIDs is spec.resources.pids.
	LimitPIDs ResourceLimitName = "pids"
	// LimitEphemeralStorage is spec.resources.ephemeralStorage.
	LimitEphemeralStorage ResourceLimitName = "ephemeralStorage"
)

// TaskNetwork is the network a task reaches.
//
// +kubebuilder:validation:Enum=Node;None;Egress
type TaskNetwork string

const (
	// NetworkNode shares the agent pod's network: whatever it reaches.
	NetworkNode TaskNetwork = "Node"
	// NetworkNone gives the task a network namespace of its own with only
	// loopback up.
	NetworkNone TaskNetwork = "None"
	// NetworkEgress gives the task a network namespace of its own with
	// loopback and a NATed IPv4 route out through the agent: it reaches
	// the outside but not the node's addresses, link-local addresses (a
	// cloud's metadata service), the ranges the agent denies (the
	// cluster's pods and Services) or other tasks; DNS goes to the agent's
	// resolvers. The default at the tenant isolation level.
	NetworkEgress TaskNetwork = "Egress"
)

// IsolationLevel is the agent's isolation level (its --isolation).
//
// +kubebuilder:validation:Enum=process;tenant
type IsolationLevel string

const (
	// IsolationLevelProcess is a session, process group and cgroup per
	// task, all tasks as one configured user: for single-tenant nodes.
	IsolationLevelProcess IsolationLevel = "process"
	// IsolationLevelTenant adds a UID per task, new mount, PID, IPC and UTS
	// namespaces, a read-only root but for the working directory, private
	// /tmp and /dev/shm, no_new_privs, Landlock and a seccomp filter.
	IsolationLevelTenant IsolationLevel = "tenant"
)

// BashTaskStatus is what the controller observed. Only the controller writes
// it, through the status subresource.
type BashTaskStatus struct {
	// conditions are the Scheduled, Running, Complete, Failed and
	// OutputUploaded conditions (the Job vocabulary) and the Ready,
	// Reconciling and Stalled conditions (the kstatus vocabulary).
	// +optional
	// +listType=map
	// +listMapKey=type
	// +patchStrategy=merge
	// +patchMergeKey=type
	// +kubebuilder:validation:MaxItems=16
	Conditions []metav1.Condition `json:"conditions,omitempty" patchStrategy:"merge" patchMergeKey:"type"`

	// observedGeneration is the metadata.generation the status was computed
	// for.
	// +optional
	ObservedGeneration *int64 `json:"observedGeneration,omitempty"`

	// phase summarises the conditions: Pending, Running, Succeeded or Failed.
	// +optional
	Phase *Phase `json:"phase,omitempty"`

	// reason is the terminal reason, set once when the task finishes.
	// +optional
	Reason *Reason `json:"reason,omitempty"`

	// message is a human-readable explanation of the reason, at most 4096
	// characters.
	// +optional
	// +kubebuilder:validation:MaxLength=4096
	Message *string `json:"message,omitempty"`

	// exitCode is the shell's exit code; 128+n when it was killed by signal n
	// (the container convention).
	// +optional
	ExitCode *int32 `json:"exitCode,omitempty"`

	// signal is the name of the signal that killed the shell, such as SIGKILL.
	// +optional
	// +kubebuilder:validation:MaxLength=16
	Signal *string `json:"signal,omitempty"`

	// nodeName is the node whose agent runs or ran the task. Written before
	// dispatch, so a task is never started on two nodes.
	// +optional
	// +kubebuilder:validation:MaxLength=253
	NodeName *string `json:"nodeName,omitempty"`

	// agent identifies the agent process the task was dispatched to.
	// +optional
	Agent *AgentRef `json:"agent,omitempty"`

	// isolation says how the agent contained the task and whether
	// spec.resources were enforced.
	// +optional
	Isolation *IsolationStatus `json:"isolation,omitempty"`

	// startTime is when the agent started the command.
	// +optional
	StartTime *metav1.Time `json:"startTime,omitempty"`

	// completionTime is when the task reached its terminal reason.
	// +optional
	CompletionTime *metav1.Time `json:"completionTime,omitempty"`

	// stdout describes the command's standard output.
	// +optional
	Stdout *StreamStatus `json:"stdout,omitempty"`

	// stderr describes the command's standard error.
	// +optional
	Stderr *StreamStatus `json:"stderr,omitempty"`

	// stdin describes a streamed standard input (spec.stdinStream), as the
	// agent last reported it.
	// +optional
	Stdin *StdinStatus `json:"stdin,omitempty"`

	// leftoverProcesses is how many processes of the task were still alive
	// when the shell exited and were then stopped.
	// +optional
	// +kubebuilder:validation:Minimum=0
	LeftoverProcesses *int32 `json:"leftoverProcesses,omitempty"`

	// workingDir is the directory the command started in, as it saw it;
	// set for a task of a workspace.
	// +optional
	// +kubebuilder:validation:MaxLength=4096
	WorkingDir *string `json:"workingDir,omitempty"`

	// workspaceRestore is set on the first task dispatched to a copy of
	// its workspace restored from a snapshot (docs/workspaces.md): which
	// snapshot, how old, and which node was lost, if one was.
	// +optional
	WorkspaceRestore *WorkspaceRestoreNotice `json:"workspaceRestore,omitempty"`

	// image is the image the task ran in and the digest it resolved to
	// (its workspace's for a workspace task); absent on the node's root
	// file system.
	// +optional
	Image *ImageStatus `json:"image,omitempty"`
}

// AgentRef identifies one incarnation of a node's agent.
type AgentRef struct {
	// pod is the agent's pod name (or its process name outside a cluster).
	// +optional
	// +kubebuilder:validation:MaxLength=253
	Pod *string `json:"pod,omitempty"`

	// incarnation is the id the agent generated when it started; a different
	// id means the agent restarted.
	// +optional
	// +kubebuilder:validation:MaxLength=64
	Incarnation *string `json:"incarnation,omitempty"`
}

// IsolationStatus says how a task was contained on its node.
type IsolationStatus struct {
	// mechanism is cgroup or processGroup.
	// +optional
	Mechanism *IsolationMechanism `json:"mechanism,omitempty"`

	// limitsEnforced is set for a task with spec.resources: true when its
	// node enforces every limit the task asks for, false while any is not
	// (limitsNotEnforced names them), from the dispatch on; never true
	// before the agent has said so.
	// +optional
	LimitsEnforced *bool `json:"limitsEnforced,omitempty"`

	// limitsNotEnforced names each limit of the task that its node does
	// not enforce: memory, cpu or pids where the node's task cgroups lack
	// the controller, ephemeralStorage where working directories get no
	// disk quota. Written at dispatch from what the agent's readiness
	// reports, then as the agent reports the task from its start.
	// +optional
	// +listType=set
	// +kubebuilder:validation:MaxItems=4
	LimitsNotEnforced []ResourceLimitName `json:"limitsNotEnforced,omitempty"`

	// level is the isolation level the task ran at: process or tenant.
	// +optional
	Level *IsolationLevel `json:"level,omitempty"`

	// user is the UID the task ran as: at the tenant level its own, leased
	// from the agent's --task-uid-range; unset when it ran as the agent's
	// user.
	// +optional
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=4294967294
	User *int64 `json:"user,omitempty"`

	// namespaces lists the Linux namespaces the task had of its own: mnt,
	// pid, ipc, uts and, with network None, net. At most 8 entries.
	// +optional
	// +listType=set
	// +kubebuilder:validation:MaxItems=8
	// +kubebuilder:validation:items:MaxLength=16
	Namespaces []string `json:"namespaces,omitempty"`

	// landlockABI is the Landlock ABI version whose rules the task ran
	// under; 0 when none applied (the kernel has no Landlock).
	// +optional
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=1000
	LandlockABI *int32 `json:"landlockABI,omitempty"`

	// seccomp is true when the task ran under the agent's seccomp filter.
	// +optional
	Seccomp *bool `json:"seccomp,omitempty"`

	// network is the network the task reached: Node, None or Egress.
	// +optional
	Network *TaskNetwork `json:"network,omitempty"`

	// processLimit names how the task's process limit was enforced:
	// pids.max (its cgroup's pids controller) or RLIMIT_NPROC (on its own
	// UID); unset when there was none.
	// +optional
	// +kubebuilder:validation:Enum=pids.max;RLIMIT_NPROC
	ProcessLimit *string `json:"processLimit,omitempty"`
}

// StdinCloseReason says why a streamed standard input was closed.
// +kubebuilder:validation:Enum=Closed;IdleTimeout;ProcessExited
type StdinCloseReason string

// The reasons of status.stdin.reason.
const (
	// StdinClosed: a client closed it (bashtasks/stdin with close=true).
	StdinClosed StdinCloseReason = "Closed"
	// StdinIdleTimeout: no request came for spec.stdinStream.idleTimeoutSeconds.
	StdinIdleTimeout StdinCloseReason = "IdleTimeout"
	// StdinProcessExited: the command closed its standard input or exited
	// while it was open.
	StdinProcessExited StdinCloseReason = "ProcessExited"
)

// StdinStatus describes a streamed standard input.
type StdinStatus struct {
	// acceptedBytes is how many bytes of input the agent accepted: the
	// offset of the next byte to send.
	// +optional
	// +kubebuilder:validation:Minimum=0
	AcceptedBytes *int64 `json:"acceptedBytes,omitempty"`

	// closed is true once the input accepts no more bytes.
	// +optional
	Closed *bool `json:"closed,omitempty"`

	// reason says why it was closed.
	// +optional
	Reason *StdinCloseReason `json:"reason,omitempty"`
}

// StreamStatus describes one output stream of the command.
type StreamStatus struct {
	// tail is the end of the stream as valid UTF-8: cut forward to a
	// character boundary, invalid bytes replaced by U+FFFD, and shortened
	// from the front when the status would exceed its size budget.
	// +optional
	// +kubebuilder:validation:MaxLength=262144
	Tail *string `json:"tail,omitempty"`

	// totalBytes is the number of bytes the command wrote to the stream.
	// +optional
	// +kubebuilder:validation:Minimum=0
	TotalBytes *int64 `json:"totalBytes,omitempty"`

	// truncated is true when tail is not the whole stream.
	// +optional
	Truncated *bool `json:"truncated,omitempty"`

	// sanitized is true when tail had invalid UTF-8 replaced.
	// +optional
	Sanitized *bool `json:"sanitized,omitempty"`

	// sha256 is the lowercase hex SHA-256 of every byte of the stream, also
	// those past the spill limit.
	// +optional
	// +kubebuilder:validation:MaxLength=64
	SHA256 *string `json:"sha256,omitempty"`

	// spill references the full stream in object storage.
	// +optional
	Spill *SpillRef `json:"spill,omitempty"`

	// parts describes the first bytes of the stream that reached object
	// storage in immutable parts while the task ran (docs/output.md): what
	// survives the loss of the node. Absent when no part was uploaded.
	// +optional
	Parts *StreamParts `json:"parts,omitempty"`
}

// StreamParts is the part of a stream uploaded while its task ran.
type StreamParts struct {
	// keptBytes is how many bytes from the stream's start were in object
	// storage, as parts, at the agent's last progress report: the bytes
	// [0, keptBytes) can be read through the log subresource even when
	// the node is gone.
	// +optional
	// +kubebuilder:validation:Minimum=0
	KeptBytes *int64 `json:"keptBytes,omitempty"`

	// lostFromOffset is set when the task ended without its agent
	// (AgentLost): every byte of the stream from this offset on is lost,
	// those counted in totalBytes and any the command wrote after the
	// agent's last report. It equals keptBytes (0 when no part was
	// uploaded).
	// +optional
	// +kubebuilder:validation:Minimum=0
	LostFromOffset *int64 `json:"lostFromOffset,omitempty"`
}

// SpillRef points at a stream's copy in object storage.
type SpillRef struct {
	// url of the object, a gocloud.dev blob URL with the key, such as
	// s3://bucket/ns/name/uid/stdout.
	// +optional
	// +kubebuilder:validation:MaxLength=2048
	URL *string `json:"url,omitempty"`

	// bytes is the size of the object.
	// +optional
	// +kubebuilder:validation:Minimum=0
	Bytes *int64 `json:"bytes,omitempty"`

	// complete is true when the object holds the whole stream, false when the
	// stream went past spillLimitBytes.
	// +optional
	Complete *bool `json:"complete,omitempty"`
}

// BashTask runs one shell command on a cluster node through the node's
// bashtask agent and records its outcome and output in status.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=bt
// +kubebuilder:selectablefield:JSONPath=`.spec.owner`
// +kubebuilder:selectablefield:JSONPath=`.status.phase`
// +kubebuilder:selectablefield:JSONPath=`.spec.workspace`
// +kubebuilder:printcolumn:name="Phase",type=string,JSONPath=`.status.phase`
// +kubebuilder:printcolumn:name="Reason",type=string,JSONPath=`.status.reason`
// +kubebuilder:printcolumn:name="Exit",type=integer,JSONPath=`.status.exitCode`
// +kubebuilder:printcolumn:name="Node",type=string,JSONPath=`.status.nodeName`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
// +kubebuilder:printcolumn:name="Start",type=date,JSONPath=`.status.startTime`,priority=10
// +kubebuilder:printcolumn:name="Completion",type=date,JSONPath=`.status.completionTime`,priority=10
type BashTask struct {
	metav1.TypeMeta `json:",inline"`

	// metadata is the standard object metadata.
	// +optional
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// spec is the command to run.
	// +required
	Spec BashTaskSpec `json:"spec"`

	// status is what the controller observed.
	// +optional
	Status BashTaskStatus `json:"status,omitempty,omitzero"`
}

// BashTaskList is a list of BashTasks.
//
// +kubebuilder:object:root=true
type BashTaskList struct {
	metav1.TypeMeta `json:",inline"`
	// metadata is the standard list metadata.
	// +optional
	metav1.ListMeta `json:"metadata,omitempty"`
	// items are the tasks.
	Items []BashTask `json:"items"`
}
