package controllers

import (
	"cmp"
	"context"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/bashtask/bashtask-operator/agentpool"
	agentv1 "github.com/bashtask/bashtask-operator/api/agent/v1"
	bashtaskv1alpha1 "github.com/bashtask/bashtask-operator/api/v1alpha1"
)

// maxStdinFromBytes caps stdin taken from a Secret or ConfigMap. Those
// objects are at most 1 MiB (the API server's limit), so this only guards
// against a future larger limit.
const maxStdinFromBytes = 1 << 20

// resolvedInput is a task's input with every reference resolved.
type resolvedInput struct {
	env   []*agentv1.EnvVar
	stdin *agentv1.Stdin
	// workspace is the task's workspace (spec.workspace), nil without one.
	workspace *agentv1.WorkspaceRef
	// image is spec.image with its pull secrets, nil without spec.image.
	image *agentv1.ImageSpec
}

// missingReferenceError names a Secret, ConfigMap or key that does not
// exist yet. The task waits for it.
type missingReferenceError struct {
	field, kind, name, key string
	objectMissing          bool
}

func (e *missingReferenceError) Error() string {
	if e.objectMissing {
		return fmt.Sprintf("%s: %s %q not found; waiting for it to be created", e.field, e.kind, e.name)
	}
	return fmt.Sprintf("%s: key %q not found in %s %q; waiting for it to be added", e.field, e.key, e.kind, e.name)
}

// invalidValueError is a resolved value that breaks a rule the schema could
// not check, so waiting will not help.
type invalidValueError struct{ msg string }

func (e *invalidValueError) Error() string { return e.msg }

// resolve reads every valueFrom and stdinFrom reference and the image pull
// secrets. Nothing is dispatched before every value exists.
func (r *BashTaskReconciler) resolve(ctx context.Context, bt *bashtaskv1alpha1.BashTask) (*resolvedInput, error) {
	out := &resolvedInput{}
	secrets, err := pullSecrets(ctx, r.apiReader, bt.Namespace, bt.Spec.ImagePullSecrets)
	if err != nil {
		return nil, err
	}
	out.image = taskImageSpec(bt, secrets)
	for i, e := range bt.Spec.Env {
		field := fmt.Sprintf("spec.env[%d] (%s)", i, e.Name)
		var value string
		if e.ValueFrom != nil {
			raw, err := r.lookup(ctx, bt.Namespace, field, e.ValueFrom)
			if err != nil {
				return nil, err
			}
			if strings.IndexByte(string(raw), 0) >= 0 {
				return nil, &invalidValueError{fmt.Sprintf("%s: the referenced value contains a NUL byte, which an environment variable cannot hold", field)}
			}
			if len(raw) > bashtaskv1alpha1.MaxEnvValueBytes {
				return nil, &invalidValueError{fmt.Sprintf("%s: the referenced value is %d bytes, over the kernel's limit of %d bytes per environment string", field, len(raw), bashtaskv1alpha1.MaxEnvValueBytes)}
			}
			value = string(raw)
		} else if e.Value != nil {
			value = *e.Value
		}
		out.env = append(out.env, &agentv1.EnvVar{Name: e.Name, Value: value})
	}
	switch {
	case bt.Spec.Stdin != nil:
		out.stdin = &agentv1.Stdin{Data: []byte(*bt.Spec.Stdin)}
	case bt.Spec.StdinFrom != nil:
		raw, err := r.lookup(ctx, bt.Namespace, "spec.stdinFrom", bt.Spec.StdinFrom)
		if err != nil {
			return nil, err
		}
		if len(raw) > maxStdinFromBytes {
			return nil, &invalidValueError{fmt.Sprintf("spec.stdinFrom: the referenced value is %d bytes, over the limit of %d", len(raw), maxStdinFromBytes)}
		}
		out.stdin = &agentv1.Stdin{Data: raw}
	}
	return out, nil
}

// lookup returns the bytes of one Secret or ConfigMap key.
func (r *BashTaskReconciler) lookup(ctx context.Context, ns, field string, src *bashtaskv1alpha1.ValueSource) ([]byte, error) {
	return lookupKey(ctx, r.apiReader, ns, field, src)
}

// lookupKey returns the bytes of one Secret or ConfigMap key of namespace
// ns read through reader; a missing object or key is a
// *missingReferenceError naming field.
func lookupKey(ctx context.Context, reader client.Reader, ns, field string, src *bashtaskv1alpha1.ValueSource) ([]byte, error) {
	switch {
	case src.SecretKeyRef != nil:
		ref := src.SecretKeyRef
		var s corev1.Secret
		if err := reader.Get(ctx, types.NamespacedName{Namespace: ns, Name: ref.Name}, &s); err != nil {
			if apierrors.IsNotFound(err) {
				return nil, &missingReferenceError{field: field, kind: "Secret", name: ref.Name, key: ref.Key, objectMissing: true}
			}
			return nil, fmt.Errorf("%s: reading Secret %s/%s: %w", field, ns, ref.Name, err)
		}
		v, ok := s.Data[ref.Key]
		if !ok {
			return nil, &missingReferenceError{field: field, kind: "Secret", name: ref.Name, key: ref.Key}
		}
		return v, nil
	case src.ConfigMapKeyRef != nil:
		ref := src.ConfigMapKeyRef
		var cm corev1.ConfigMap
		if err := reader.Get(ctx, types.NamespacedName{Namespace: ns, Name: ref.Name}, &cm); err != nil {
			if apierrors.IsNotFound(err) {
				return nil, &missingReferenceError{field: field, kind: "ConfigMap", name: ref.Name, key: ref.Key, objectMissing: true}
			}
			return nil, fmt.Errorf("%s: reading ConfigMap %s/%s: %w", field, ns, ref.Name, err)
		}
		if v, ok := cm.Data[ref.Key]; ok {
			return []byte(v), nil
		}
		if v, ok := cm.BinaryData[ref.Key]; ok {
			return v, nil
		}
		return nil, &missingReferenceError{field: field, kind: "ConfigMap", name: ref.Name, key: ref.Key}
	}
	return nil, &invalidValueError{field + ": no secretKeyRef or configMapKeyRef"}
}

// admitOwner applies --max-running-per-owner. It returns admitted=false
// when the owner is at its limit. An admitted task holds a reservation
// until the cache shows it dispatched, so that concurrent workers cannot
// admit more than the limit between a count and a write; release drops the
// reservation when dispatch did not happen.
func (r *BashTaskReconciler) admitOwner(ctx context.Context, bt *bashtaskv1alpha1.BashTask) (release func(), admitted bool, err error) {
	noop := func() {}
	owner := ptr.Deref(bt.Spec.Owner, "")
	if r.opts.MaxRunningPerOwner <= 0 || owner == "" {
		return noop, true, nil
	}
	r.ownerMu.Lock()
	defer r.ownerMu.Unlock()
	var list bashtaskv1alpha1.BashTaskList
	if err := r.client.List(ctx, &list, client.MatchingFields{IndexOwner: owner}); err != nil {
		return noop, false, fmt.Errorf("listing tasks of owner %q: %w", owner, err)
	}
	res := r.reserved[owner]
	if res == nil {
		res = map[types.UID]bool{}
		r.reserved[owner] = res
	}
	seen := map[types.UID]bool{}
	active := 0
	for i := range list.Items {
		t := &list.Items[i]
		seen[t.UID] = true
		if isDispatched(t) || isTerminal(t) {
			delete(res, t.UID) // the cache caught up with the reservation
		}
		if isDispatched(t) && !isTerminal(t) {
			active++
		}
	}
	for uid := range res {
		if uid == bt.UID {
			continue
		}
		if seen[uid] {
			active++
		} else {
			delete(res, uid) // deleted before it was dispatched
		}
	}
	if active >= r.opts.MaxRunningPerOwner {
		return noop, false, nil
	}
	res[bt.UID] = true
	return func() {
		r.ownerMu.Lock()
		delete(r.reserved[owner], bt.UID)
		r.ownerMu.Unlock()
	}, true, nil
}

// placementRequest is what a task asks of its agent: spec.nodeName, else
// the agents whose Node matches spec.nodeSelector, else every agent; among
// those, on a node that takes new work (see nodeUnschedulable), a ready one
// with free capacity and the fewest running tasks (see placeAgent).
func (r *BashTaskReconciler) placementRequest(bt *bashtaskv1alpha1.BashTask) placementRequest {
	return placementRequest{
		what:         "the task",
		nodeName:     ptr.Deref(bt.Spec.NodeName, ""),
		nodeSelector: bt.Spec.NodeSelector,
		network:      ptr.Deref(bt.Spec.Network, ""),
		tolerations:  r.opts.AgentTolerations,
		notEnforced:  func(a *agentpool.AgentState) []bashtaskv1alpha1.ResourceLimitName { return notEnforcedOn(bt, a) },
		image:        bt.Spec.Image != nil,
	}
}

// agentLister is the part of the agent registry placement reads.
type agentLister interface {
	Agents() []agentpool.AgentState
	Agent(node string) agentpool.AgentState
}

// placement is the outcome of placing a task or a workspace: the chosen
// agent, or why there is none. Exactly one of agent and reason is set.
type placement struct {
	// agent is the chosen agent, nil when none fits.
	agent *agentpool.AgentState
	// reason is the Scheduled reason while none fits
	// (ReasonNodeUnschedulable when every candidate's node refuses new
	// work, else ReasonNoAgent).
	reason string
	// why explains the wait, for the Scheduled condition's message.
	why string
	// invalid is set, to why, when every candidate refuses the object's
	// spec.network by its --allowed-networks: a policy of the nodes, not a
	// wait, so the object ends InvalidSpec (a task) or Failed (a workspace)
	// instead of waiting.
	invalid string
}

// placementRequest is what an object asks of the agent it is placed on.
// Tasks and workspaces share it, so both follow one set of placement
// rules.
type placementRequest struct {
	// what names the object in messages ("the task", "the workspace").
	what string
	// nodeName and nodeSelector are the object's spec fields.
	nodeName     string
	nodeSelector map[string]string
	// network is the object's spec.network, "" for the agent's default.
	network bashtaskv1alpha1.TaskNetwork
	// tolerations are the agent's configured tolerations
	// (Options.AgentTolerations), against which the Nodes' taints count.
	tolerations []corev1.Toleration
	// workspace asks for an agent that makes workspaces: at the tenant
	// isolation level, with the "workspaces" capability.
	workspace bool
	// restore asks for an agent that restores snapshots (the "snapshots"
	// capability: a bucket the nodes share).
	restore bool
	// image asks for an agent that runs tasks in images: one with an
	// image store, which its readiness names with the "images"
	// capability (the tenant isolation level, docs/images.md). An agent
	// without one would run the object on the node's root.
	image bool
	// rootInside asks for an agent whose tasks may be root inside their
	// image (the "root-inside" capability: an image store and user
	// namespaces on the node, docs/images.md "Root inside").
	rootInside bool
	// anyCapacity places on an agent that runs its maximum of tasks:
	// a workspace runs nothing by itself.
	anyCapacity bool
	// load ranks the candidates, lowest first, before the running tasks
	// and the node name; nil ranks by those alone.
	load func(a *agentpool.AgentState) int
	// notEnforced names the limits the object asks for that an agent's
	// node does not enforce: agents without any are preferred (see
	// chooseEnforcing); nil prefers none.
	notEnforced func(a *agentpool.AgentState) []bashtaskv1alpha1.ResourceLimitName
}

// placeAgent chooses the agent for p: p.nodeName, else the agents whose
// Node matches p.nodeSelector, else every agent. It reads each
// candidate's Node once, for the selector and for its scheduling state
// (nodeUnschedulable; a missing Node takes nothing either, as the
// scheduler places nothing on a node it does not know), then leaves the
// choice to chooseEnforcing.
func placeAgent(ctx context.Context, reader client.Reader, agents agentLister, p placementRequest) placement {
	var candidates []agentpool.AgentState
	if p.nodeName != "" {
		candidates = []agentpool.AgentState{agents.Agent(p.nodeName)}
	} else {
		candidates = agents.Agents()
	}
	var sel labels.Selector
	if len(p.nodeSelector) > 0 {
		sel = labels.SelectorFromSet(p.nodeSelector)
	}
	kept := candidates[:0:0]
	refused := map[string]string{}
	for _, a := range candidates {
		// Read only: no copy of each Node (their image lists make them
		// large) for every task placed.
		var n corev1.Node
		err := reader.Get(ctx, types.NamespacedName{Name: a.Node}, &n, client.UnsafeDisableDeepCopy)
		if sel != nil && (err != nil || !sel.Matches(labels.Set(n.Labels))) {
			continue
		}
		switch {
		case apierrors.IsNotFound(err):
			refused[a.Node] = fmt.Sprintf("node %s has no Node object", a.Node)
		case err != nil:
			refused[a.Node] = fmt.Sprintf("node %s: reading its Node: %v", a.Node, err)
		default:
			if m := nodeUnschedulable(&n, p.tolerations); m != "" {
				refused[a.Node] = m
			}
		}
		kept = append(kept, a)
	}
	return chooseEnforcing(p, kept, refused)
}

// chooseAgent chooses among candidates, the agents that match p's
// nodeName or nodeSelector, skipping those whose node unschedulable names
// (node name to why): a ready agent that offers what p asks for, with
// free capacity (unless p.anyCapacity), the lowest p.load and the fewest
// running tasks. When none fits, the placement says why (see placement).
func chooseAgent(p placementRequest, candidates []agentpool.AgentState, unschedulable map[string]string) placement {
	node := p.nodeName
	rank := func(a *agentpool.AgentState) int {
		if p.load == nil {
			return 0
		}
		return p.load(a)
	}
	var best *agentpool.AgentState
	bestRank := 0
	notReady, full, lacking, refused := 0, 0, 0, 0
	var cordoned []string
	missing, refusal := "", ""
	for i := range candidates {
		a := &candidates[i]
		if m := unschedulable[a.Node]; m != "" {
			cordoned = append(cordoned, m)
			continue
		}
		if !a.Ready {
			notReady++
			continue
		}
		if m := networkNotAllowed(p.network, a); m != "" {
			refused++
			refusal = m
			continue
		}
		m := missingCapability(p.network, a)
		if m == "" && p.workspace && (a.Isolation != string(bashtaskv1alpha1.IsolationLevelTenant) || !slices.Contains(a.Capabilities, "workspaces")) {
			m = "a workspace needs an agent at the tenant isolation level (--isolation=tenant) that serves workspaces (the workspaces capability)"
		}
		if m == "" && p.image && !slices.Contains(a.Capabilities, "images") {
			m = "spec.image needs an agent with an image store (the images capability: the tenant isolation level, docs/images.md)"
		}
		if m == "" && p.rootInside && !slices.Contains(a.Capabilities, "root-inside") {
			m = "spec.rootInside needs an agent whose node allows user namespaces, with an image store (the root-inside capability, docs/images.md)"
		}
		if m == "" && p.restore && !slices.Contains(a.Capabilities, "snapshots") {
			m = "restoring a workspace needs an agent with a bucket the nodes share (--output-bucket-url; the snapshots capability)"
		}
		if m != "" {
			lacking++
			missing = m
			continue
		}
		if !p.anyCapacity && a.Capacity > 0 && a.Running >= a.Capacity {
			full++
			continue
		}
		ar := rank(a)
		if best == nil || ar < bestRank || (ar == bestRank && (a.Running < best.Running || (a.Running == best.Running && a.Node < best.Node))) {
			best, bestRank = a, ar
		}
	}
	if best != nil {
		return placement{agent: best}
	}
	// Only when every candidate refuses: an agent on a node that takes no
	// work now may allow the network once it does.
	if refused > 0 && refused == len(candidates) {
		return placement{reason: ReasonNoAgent, why: refusal, invalid: refusal}
	}
	where := "any node"
	switch {
	case node != "":
		where = "node " + node
	case len(p.nodeSelector) > 0:
		where = "nodes matching " + labels.SelectorFromSet(p.nodeSelector).String()
	}
	if len(cordoned) > 0 && len(cordoned) == len(candidates) {
		return placement{reason: ReasonNodeUnschedulable, why: fmt.Sprintf("no node on %s takes new work: %s; waiting for one to become schedulable", where, nodeList(cordoned))}
	}
	if node != "" && len(candidates) == 1 && candidates[0].Incarnation == "" && !candidates[0].Connected {
		return placement{reason: ReasonNoAgent, why: fmt.Sprintf("no agent has reported from node %s (spec.nodeName); retrying", node)}
	}
	skipped := ""
	if len(cordoned) > 0 {
		skipped = fmt.Sprintf("; not schedulable: %s", nodeList(cordoned))
	}
	if lacking > 0 && full == 0 && lacking+notReady+len(cordoned) == len(candidates) {
		return placement{reason: ReasonNoAgent, why: fmt.Sprintf("no ready agent on %s offers what %s asks for: %s (%d matching, %d on unschedulable nodes, %d not ready, %d lacking it%s); retrying", where, p.what, missing, len(candidates), len(cordoned), notReady, lacking, skipped)}
	}
	return placement{reason: ReasonNoAgent, why: fmt.Sprintf("no ready agent with free capacity on %s (%d matching, %d on unschedulable nodes, %d not ready, %d at capacity, %d lacking a capability, %d not allowing spec.network%s); retrying", where, len(candidates), len(cordoned), notReady, full, lacking, refused, skipped)}
}

// maxNamedNodes bounds how many nodes a placement message names, so that
// a large cordoned pool does not fill the condition's message.
const maxNamedNodes = 5

// nodeList joins the first maxNamedNodes of why (one sentence per node,
// sorted) and counts the rest.
func nodeList(why []string) string {
	why = slices.Sorted(slices.Values(why))
	if len(why) <= maxNamedNodes {
		return strings.Join(why, "; ")
	}
	return fmt.Sprintf("%s; and %d more", strings.Join(why[:maxNamedNodes], "; "), len(why)-maxNamedNodes)
}

// networkNotAllowed names the refusal of spec.network n by agent a's
// --allowed-networks (the field, the value and the list), empty when a
// allows it or does not report the list.
func networkNotAllowed(n bashtaskv1alpha1.TaskNetwork, a *agentpool.AgentState) string {
	if n == "" || len(a.AllowedNetworks) == 0 || slices.Contains(a.AllowedNetworks, string(n)) {
		return ""
	}
	return fmt.Sprintf("spec.network %s is not allowed on node %s: its agent's --allowed-networks are %s", n, a.Node, strings.Join(a.AllowedNetworks, ", "))
}

// missingCapability names what agent a lacks for spec.network n, empty
// when it offers it: network None needs the tenant level with a network
// namespace ("netns"); network Egress the tenant level with the "egress"
// capability (its nftables table was set up); network Node needs an agent
// whose default is not None (a task may ask for less network than its
// agent offers, never more).
func missingCapability(n bashtaskv1alpha1.TaskNetwork, a *agentpool.AgentState) string {
	switch n {
	case bashtaskv1alpha1.NetworkNone:
		if a.Isolation != string(bashtaskv1alpha1.IsolationLevelTenant) || !slices.Contains(a.Capabilities, "netns") {
			return "spec.network None needs an agent at the tenant isolation level with the netns capability"
		}
	case bashtaskv1alpha1.NetworkEgress:
		if a.Isolation != string(bashtaskv1alpha1.IsolationLevelTenant) || !slices.Contains(a.Capabilities, "egress") {
			return "spec.network Egress needs an agent at the tenant isolation level with the egress capability"
		}
	case bashtaskv1alpha1.NetworkNode:
		if a.TaskNetwork == string(bashtaskv1alpha1.NetworkNone) {
			return "spec.network Node needs an agent whose --task-network is node"
		}
	}
	return ""
}

// taskSpecOn is taskSpec for a task about to be dispatched to node, whose
// status does not name the node yet (BASHTASK_NODE is part of the request).
func (r *BashTaskReconciler) taskSpecOn(bt *bashtaskv1alpha1.BashTask, in *resolvedInput, node string) *agentv1.TaskSpec {
	spec := r.taskSpec(bt, in)
	for _, e := range spec.ManagedEnv {
		if e.Name == ManagedEnvNode {
			e.Value = node
		}
	}
	return spec
}

// taskSpec builds the agent request: everything resolved, defaults applied.
func (r *BashTaskReconciler) taskSpec(bt *bashtaskv1alpha1.BashTask, in *resolvedInput) *agentv1.TaskSpec {
	out := &agentv1.OutputSettings{
		TailBytes:       bashtaskv1alpha1.DefaultTailBytes,
		SpillLimitBytes: bashtaskv1alpha1.DefaultSpillLimitBytes,
		Upload:          agentv1.UploadPolicy_UPLOAD_POLICY_WHEN_INCOMPLETE,
	}
	if o := bt.Spec.Output; o != nil {
		if o.TailBytes != nil {
			out.TailBytes = *o.TailBytes
		}
		if o.SpillLimitBytes != nil {
			out.SpillLimitBytes = *o.SpillLimitBytes
		}
		switch ptr.Deref(o.Upload, "") {
		case bashtaskv1alpha1.UploadAlways:
			out.Upload = agentv1.UploadPolicy_UPLOAD_POLICY_ALWAYS
		case bashtaskv1alpha1.UploadNever:
			out.Upload = agentv1.UploadPolicy_UPLOAD_POLICY_NEVER
		}
	}
	spec := &agentv1.TaskSpec{
		Ref:        &agentv1.TaskRef{Namespace: bt.Namespace, Name: bt.Name, Uid: string(bt.UID)},
		Command:    bt.Spec.Command,
		Stdin:      in.stdin,
		Env:        in.env,
		WorkingDir: ptr.Deref(bt.Spec.WorkingDir, ""),
		// Never cut to the cap: timeoutGate refused a task over it.
		Timeout:   durationpb.New(taskTimeout(&bt.Spec, r.opts.MaxTimeoutSeconds).d),
		KillGrace: durationpb.New(taskKillGrace(&bt.Spec)),
		Output:    out,
		Network:   string(ptr.Deref(bt.Spec.Network, "")),
		Egress:    egressPolicySpec(bt.Spec.Egress),
		Workspace: in.workspace,
		Image:     in.image,
		Tty:       ptr.Deref(bt.Spec.TTY, false),
		ManagedEnv: []*agentv1.EnvVar{
			{Name: ManagedEnvName, Value: bt.Name},
			{Name: ManagedEnvNamespace, Value: bt.Namespace},
			{Name: ManagedEnvUID, Value: string(bt.UID)},
			{Name: ManagedEnvNode, Value: nodeOf(&bt.Status)},
		},
	}
	if ss := bt.Spec.StdinStream; ss != nil {
		idle := ptr.Deref(ss.IdleTimeoutSeconds, bashtaskv1alpha1.DefaultStdinIdleTimeoutSeconds)
		spec.StdinStream = &agentv1.StdinStream{IdleTimeout: durationpb.New(time.Duration(idle) * time.Second)}
	}
	if res := bt.Spec.Resources; res != nil {
		spec.Resources = &agentv1.Resources{}
		if res.Memory != nil {
			spec.Resources.MemoryBytes = res.Memory.Value()
		}
		if res.CPU != nil {
			spec.Resources.CpuMillis = res.CPU.MilliValue()
		}
		if res.PIDs != nil {
			spec.Resources.Pids = *res.PIDs
		}
		if res.EphemeralStorage != nil {
			spec.Resources.EphemeralStorageBytes = res.EphemeralStorage.Value()
		}
	}
	return spec
}

// startSizeError checks a Start for spec against what the agent a accepts
// and returns, for one it would refuse, why: the working directory's size
// against the agent's disk cap (Readiness.disk_cap_bytes), the command and resolved
// environment against the agent's ARG_MAX (AgentInfo.arg_env_limit_bytes:
// execve's limit on arguments and environment together, which the agent
// reports from its stack size limit), and the whole request, environment
// and stdin included, against its largest request message
// (agentv1.MaxRequestBytes, as the agent reports it). The message gives the
// sizes and the limit and names the largest entries. It returns "" when the
// agent reports no limits or the request fits.
//
// The agent adds its own entries (LANG, TERM, ... and the scrubbed ambient
// environment) to what is measured here; a task that only fails with
// those still ends StartFailed with the agent's figures.
func startSizeError(spec *agentv1.TaskSpec, a *agentpool.AgentState) string {
	shell := cmp.Or(a.Shell, "/bin/bash")
	envBytes := agentv1.ArgEnvBytes(spec, shell)
	if a.ArgEnvLimit > 0 && envBytes > a.ArgEnvLimit {
		return fmt.Sprintf("the command (%d bytes) and resolved environment (%d entries) take %d bytes as execve counts them, over the limit of %d bytes the agent on node %s accepts for arguments and environment together (ARG_MAX, which follows its stack size limit)%s",
			len(spec.GetCommand()), len(spec.GetEnv())+len(spec.GetManagedEnv()), envBytes, a.ArgEnvLimit, a.Node, largestEntries(spec.GetEnv()))
	}
	if d := spec.GetResources().GetEphemeralStorageBytes(); a.DiskCap > 0 && d > a.DiskCap {
		return fmt.Sprintf("spec.resources.ephemeralStorage of %d bytes is over the cap of %d bytes of the agent on node %s (--task-disk-cap)", d, a.DiskCap, a.Node)
	}
	if a.MaxRequestBytes > 0 {
		if n := int64(proto.Size(&agentv1.StartRequest{Spec: spec, Fence: &agentv1.Fence{Holder: strings.Repeat("x", 253), Epoch: math.MaxInt64}})); n > a.MaxRequestBytes {
			return fmt.Sprintf("the request to start the task is %d bytes (environment %d bytes, stdin %d bytes, command %d bytes), over the limit of %d bytes per request of the agent on node %s",
				n, envBytes, len(spec.GetStdin().GetData()), len(spec.GetCommand()), a.MaxRequestBytes, a.Node)
		}
	}
	return ""
}

// largestEntries names the three largest environment entries with their
// sizes, for a message that should say what to shrink.
func largestEntries(env []*agentv1.EnvVar) string {
	sorted := slices.SortedStableFunc(slices.Values(env), func(a, b *agentv1.EnvVar) int {
		return len(b.GetName()) + len(b.GetValue()) - (len(a.GetName()) + len(a.GetValue()))
	})
	if len(sorted) == 0 {
		return ""
	}
	parts := make([]string, 0, 3)
	for _, e := range sorted[:min(3, len(sorted))] {
		parts = append(parts, fmt.Sprintf("%s (%d bytes)", e.GetName(), len(e.GetName())+1+len(e.GetValue())))
	}
	return "; the largest entries: " + strings.Join(parts, ", ")
}
