package packaging_test

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/bashtask/bashtask-operator/controllers"
)

const (
	// chartNamespace and chartRelease are the namespace and release name
	// the chart is rendered with.
	chartNamespace = "bt-system"
	chartRelease   = "bt"
	// kubeVersion is the version of the test rig's kube-apiserver (the
	// k8s.io/* libraries in go.mod), given to helm for .Capabilities.
	kubeVersion = "1.37.2"
)

// rendering is one way of installing the operator.
type rendering struct {
	name string
	// cmd renders YAML with a tool from bin/: its first element names the tool.
	cmd []string
	// namespace the operator's namespaced objects land in.
	namespace string
	// wantKinds are the kinds rendered, with how many objects of each.
	wantKinds map[string]int
}

func renderings() []rendering {
	helm := func(extra ...string) []string {
		return append([]string{"helm", "template", chartRelease, "charts/bashtask", "--namespace", chartNamespace,
			"--include-crds", "--kube-version", kubeVersion}, extra...)
	}
	base := map[string]int{
		"CustomResourceDefinition": 2, "ServiceAccount": 2, "ClusterRole": 1, "ClusterRoleBinding": 1,
		"Service": 2, "Deployment": 1, "DaemonSet": 1,
		"MutatingAdmissionPolicy": 2, "MutatingAdmissionPolicyBinding": 2,
		"ValidatingAdmissionPolicy": 1, "ValidatingAdmissionPolicyBinding": 1,
	}
	with := func(extra map[string]int) map[string]int {
		m := map[string]int{}
		for k, v := range base {
			m[k] = v
		}
		for k, v := range extra {
			m[k] = v
		}
		return m
	}
	// The chart's pre-delete hook (uninstall-hook.yaml), rendered by helm
	// template like every hook.
	withHook := func(extra map[string]int) map[string]int {
		m := with(extra)
		for k, v := range map[string]int{"ServiceAccount": 1, "ClusterRole": 1, "ClusterRoleBinding": 1, "Job": 1} {
			m[k] += v
		}
		return m
	}
	// The output API (output-api.yaml, output-api-rbac.yaml): its Service,
	// the APIService, the server's two delegation bindings, the readers'
	// ClusterRole and the writers' (stdin, attach, port-forward); its serving certificate is one
	// Secret (helm) or Certificate (cert-manager) more.
	withOutputAPI := func(m map[string]int) map[string]int {
		for k, v := range map[string]int{"Service": 1, "APIService": 1, "ClusterRoleBinding": 1, "RoleBinding": 1, "ClusterRole": 2} {
			m[k] += v
		}
		return m
	}
	return []rendering{
		{
			name: "helm default values", cmd: helm(), namespace: chartNamespace,
			wantKinds: withOutputAPI(withHook(map[string]int{"Secret": 3})),
		},
		{
			name: "helm without the output API", cmd: helm("--set", "outputAPI.enabled=false"), namespace: chartNamespace,
			wantKinds: withHook(map[string]int{"Secret": 2}),
		},
		{
			name: "helm cert-manager, ServiceMonitors, two controller replicas",
			cmd: helm("--set", "certificates.source=cert-manager", "--set", "serviceMonitor.enabled=true",
				"--set", "controller.replicas=2", "--set", "agent.bucket.url=s3://outputs?region=eu-west-1",
				"--set", "agent.bucket.existingSecret=bucket-credentials", "--set", "agent.ambientEnv=allowlist",
				"--set", "agent.ambientAllow={HTTP_PROXY,NO_PROXY}", "--set", "controller.maxRunningPerOwner=4",
				"--set", "controller.defaultTTLSecondsAfterFinished=3600", "--set", "controller.ttlDeletesGitOpsManaged=true",
				"--set-json", `agent.extraVolumes=[{"name":"gcp","secret":{"secretName":"gcp-key"}}]`,
				"--set-json", `agent.extraVolumeMounts=[{"name":"gcp","mountPath":"/var/run/gcp","readOnly":true}]`,
				"--set-json", `agent.extraEnv=[{"name":"GOOGLE_APPLICATION_CREDENTIALS","value":"/var/run/gcp/key.json"}]`,
				"--set-json", `agent.tolerations=[{"key":"nvidia.com/gpu","operator":"Exists","effect":"NoSchedule"},{"key":"pool","value":"agents"}]`),
			namespace: chartNamespace,
			wantKinds: withOutputAPI(withHook(map[string]int{"Certificate": 4, "Issuer": 2, "ServiceMonitor": 2, "PodDisruptionBudget": 1})),
		},
		{
			name: "helm cert-manager with an existing ClusterIssuer",
			cmd: helm("--set", "certificates.source=cert-manager", "--set", "certificates.certManager.issuerRef.name=cluster-ca",
				"--set", "certificates.certManager.issuerRef.kind=ClusterIssuer", "--set", "certificates.certManager.issuerRef.group=cert-manager.io"),
			namespace: chartNamespace,
			wantKinds: withOutputAPI(withHook(map[string]int{"Certificate": 3})),
		},
		{
			name: "helm agent without cgroups or privileged mode",
			cmd: helm("--set", "agent.cgroups=off", "--set", "agent.hostCgroupPath=", "--set-json",
				`agent.securityContext={"privileged":false,"allowPrivilegeEscalation":false,`+
					`"capabilities":{"drop":["ALL"],"add":["CHOWN","DAC_OVERRIDE","FOWNER","KILL","SETUID","SETGID"]}}`),
			namespace: chartNamespace,
			wantKinds: withOutputAPI(withHook(map[string]int{"Secret": 3})),
		},
		{
			name: "kustomize config/default", cmd: []string{"kustomize", "build", "config/default"}, namespace: "bashtask-system",
			wantKinds: with(map[string]int{"Namespace": 1, "Certificate": 3, "Issuer": 2}),
		},
		{
			name: "kustomize config/samples", cmd: []string{"kustomize", "build", "config/samples"}, namespace: "bashtask-system",
			wantKinds: map[string]int{"BashTask": 1},
		},
	}
}

// tool returns the path of a tool built by `make tools`; a missing tool
// fails the test rather than skipping it.
func tool(t *testing.T, name string) string {
	t.Helper()
	p := filepath.Join(root, "bin", name)
	if _, err := os.Stat(p); err != nil {
		t.Fatalf("%s missing (run make tools): %v", p, err)
	}
	return p
}

// render runs the rendering's command in the repository root and returns
// its objects.
func render(t *testing.T, r rendering) []*unstructured.Unstructured {
	t.Helper()
	out := runTool(t, nil, r.cmd[0], r.cmd[1:]...)
	docs, err := splitYAML(out)
	if err != nil {
		t.Fatalf("%s: %v", strings.Join(r.cmd, " "), err)
	}
	var objs []*unstructured.Unstructured
	for _, doc := range docs {
		u := &unstructured.Unstructured{}
		if err := utilyaml.Unmarshal(doc, &u.Object); err != nil {
			t.Fatalf("decoding a rendered object: %v\n%s", err, doc)
		}
		objs = append(objs, u)
	}
	return objs
}

func runTool(t *testing.T, stdin []byte, name string, args ...string) []byte {
	t.Helper()
	cmd := exec.CommandContext(t.Context(), tool(t, name), args...)
	cmd.Dir = root
	if stdin != nil {
		cmd.Stdin = bytes.NewReader(stdin)
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s%s", name, strings.Join(args, " "), err, out, stderr.Bytes())
	}
	return out
}

// splitYAML returns the non-empty documents of a YAML stream.
func splitYAML(data []byte) ([][]byte, error) {
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	var docs [][]byte
	for {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			return docs, nil
		}
		if err != nil {
			return nil, err
		}
		var probe map[string]any
		if err := utilyaml.Unmarshal(doc, &probe); err != nil {
			return nil, err
		}
		if len(probe) > 0 {
			docs = append(docs, doc)
		}
	}
}

func TestRenderings(t *testing.T) {
	schemaDir := kubeconformSchemas(t)
	for _, r := range renderings() {
		t.Run(r.name, func(t *testing.T) {
			objs := render(t, r)
			kinds := map[string]int{}
			for _, o := range objs {
				kinds[o.GetKind()]++
			}
			if diff := cmp.Diff(r.wantKinds, kinds); diff != "" {
				t.Errorf("rendered kinds (-want +got):\n%s", diff)
			}
			for _, o := range objs {
				if o.GetKind() == "RoleBinding" && o.GetNamespace() == "kube-system" {
					continue // the output API's extension-apiserver-authentication-reader binding (checkOutputAPI)
				}
				if ns := o.GetNamespace(); ns != "" && ns != r.namespace {
					t.Errorf("%s %s in namespace %q, want %q", o.GetKind(), o.GetName(), ns, r.namespace)
				}
			}
			t.Run("strict decoding", func(t *testing.T) { decodeStrict(t, objs) })
			t.Run("kubeconform", func(t *testing.T) { runKubeconform(t, schemaDir, objs) })
			t.Run("server-side dry run", func(t *testing.T) { dryRun(t, objs, r.namespace) })
			t.Run("wiring", func(t *testing.T) { checkWiring(t, objs, r.namespace) })
			t.Run("output API", func(t *testing.T) { checkOutputAPI(t, objs, r.namespace) })
		})
	}
}

// decodeStrict decodes every object of a built-in or bashtask.dev kind
// into its Go type, failing on unknown or duplicate fields.
func decodeStrict(t *testing.T, objs []*unstructured.Unstructured) {
	t.Helper()
	decoder := serializer.NewCodecFactory(env.Scheme, serializer.EnableStrict).UniversalDeserializer()
	for _, o := range objs {
		if !env.Scheme.Recognizes(o.GroupVersionKind()) {
			continue // cert-manager and prometheus-operator kinds: the dry run checks them.
		}
		data, err := o.MarshalJSON()
		if err != nil {
			t.Fatal(err)
		}
		if _, _, err := decoder.Decode(data, nil, nil); err != nil {
			t.Errorf("%s %s: %v", o.GetKind(), o.GetName(), err)
		}
	}
}

// dryRun applies every object to the real API server with a server-side
// dry run: the server's own validation (server-side apply refuses fields
// its schema does not declare), admission and, for BashTasks, the CRD's
// schema and CEL rules.
func dryRun(t *testing.T, objs []*unstructured.Unstructured, namespace string) {
	t.Helper()
	for _, o := range objs {
		o = o.DeepCopy()
		if o.GetKind() == "Namespace" {
			continue // created by TestMain; a dry run would pass without proving anything more.
		}
		if o.GetKind() == "BashTask" && o.GetNamespace() == "" {
			o.SetNamespace(namespace)
		}
		err := env.Client.Apply(t.Context(), client.ApplyConfigurationFromUnstructured(o), client.DryRunAll,
			client.ForceOwnership, client.FieldOwner("packaging-test"))
		if err != nil {
			t.Errorf("%s %s: %v", o.GetKind(), o.GetName(), err)
		}
	}
}

// checkWiring checks the agreements between the objects that no schema
// can: names, ports and identities the controller and agents rely on.
func checkWiring(t *testing.T, objs []*unstructured.Unstructured, namespace string) {
	t.Helper()
	var (
		deploy    *appsv1.Deployment
		daemonSet *appsv1.DaemonSet
		services  = map[string]*corev1.Service{}
		sas       = map[string]*corev1.ServiceAccount{}
		certs     = map[string]*unstructured.Unstructured{}
	)
	for _, o := range objs {
		switch o.GetKind() {
		case "Deployment":
			deploy = &appsv1.Deployment{}
			fromUnstructured(t, o, deploy)
		case "DaemonSet":
			daemonSet = &appsv1.DaemonSet{}
			fromUnstructured(t, o, daemonSet)
		case "Service":
			s := &corev1.Service{}
			fromUnstructured(t, o, s)
			services[s.Name] = s
		case "ServiceAccount":
			s := &corev1.ServiceAccount{}
			fromUnstructured(t, o, s)
			sas[s.Name] = s
		case "Certificate":
			certs[o.GetName()] = o
		case "CustomResourceDefinition":
			crd := &apiextensionsv1.CustomResourceDefinition{}
			fromUnstructured(t, o, crd)
			if crd.Name != "bashtasks.bashtask.dev" && crd.Name != "bashworkspaces.bashtask.dev" {
				t.Errorf("unexpected CRD %s", crd.Name)
			}
		}
	}
	if deploy == nil && daemonSet == nil {
		return // samples only
	}
	if deploy == nil || daemonSet == nil {
		t.Fatalf("want a controller Deployment and an agent DaemonSet")
	}

	ctrl := deploy.Spec.Template.Spec.Containers[0]
	agent := daemonSet.Spec.Template.Spec.Containers[0]
	flags := flagValues(ctrl.Args)
	if flags["leader-elect"] != "true" {
		t.Errorf("controller --leader-elect = %q, want true", flags["leader-elect"])
	}
	// The controller finds the agents through their headless Service's
	// EndpointSlices, by port name, and checks their certificate's name.
	svcName := valueOr(flags, "agent-service", "bashtask-agent")
	svcNamespace := valueOr(flags, "agent-namespace", "bashtask-system")
	portName := valueOr(flags, "agent-port-name", "grpc")
	serverName := valueOr(flags, "agent-server-name", svcName+"."+svcNamespace+".svc")
	if svcNamespace != namespace {
		t.Errorf("controller looks for the agents in namespace %s, they are in %s", svcNamespace, namespace)
	}
	svc := services[svcName]
	if svc == nil {
		t.Fatalf("no agent Service %s; services: %v", svcName, keys(services))
	}
	if svc.Spec.ClusterIP != corev1.ClusterIPNone {
		t.Errorf("agent Service %s is not headless", svcName)
	}
	if !selects(svc.Spec.Selector, daemonSet.Spec.Template.Labels) {
		t.Errorf("agent Service selector %v does not select the agent pods %v", svc.Spec.Selector, daemonSet.Spec.Template.Labels)
	}
	grpcPort := -1
	for _, p := range svc.Spec.Ports {
		if p.Name == portName {
			grpcPort = int(p.Port)
		}
	}
	if grpcPort < 0 {
		t.Errorf("agent Service has no port named %q", portName)
	}
	listen := valueOr(flagValues(agent.Args), "listen", ":9443")
	if listen != fmt.Sprintf(":%d", grpcPort) {
		t.Errorf("agent --listen=%s, Service port %s is %d", listen, portName, grpcPort)
	}

	// The agent uploads a running stream in parts (docs/output.md) with
	// values its flags accept.
	// Without the flags (config/), the agent's defaults apply.
	partBytes := valueOr(flagValues(agent.Args), "output-part-bytes", "8388608")
	if n, err := strconv.ParseInt(partBytes, 10, 64); err != nil || (n != 0 && n < 64<<10) {
		t.Errorf("agent --output-part-bytes=%q: want 0 or at least 65536 (%v)", partBytes, err)
	}
	partInterval := valueOr(flagValues(agent.Args), "output-part-interval", "10s")
	if d, err := time.ParseDuration(partInterval); err != nil || d < time.Second {
		t.Errorf("agent --output-part-interval=%q: want a duration of at least 1s (%v)", partInterval, err)
	}

	pod := daemonSet.Spec.Template.Spec
	// On SIGTERM the agent waits while its workspaces move, then gives open
	// calls their time (docs/workspaces.md, "Agent shutdown"): kubelet's
	// SIGKILL must come after both.
	var stopFor time.Duration
	for flag, def := range map[string]string{"shutdown-workspace-timeout": "30s", "shutdown-timeout": "30s"} {
		d, err := time.ParseDuration(valueOr(flagValues(agent.Args), flag, def))
		if err != nil {
			t.Errorf("agent --%s: %v", flag, err)
		}
		stopFor += d
	}
	if grace := time.Duration(ptr.Deref(pod.TerminationGracePeriodSeconds, 30)) * time.Second; grace <= stopFor {
		t.Errorf("agent terminationGracePeriodSeconds %v: want more than --shutdown-workspace-timeout plus --shutdown-timeout, %v", grace, stopFor)
	}
	// The controller keeps new tasks off nodes whose taints the agent's
	// configured tolerations do not tolerate: it must be given the same.
	tolerations, err := controllers.ParseAgentTolerations(flags["agent-tolerations"])
	if err != nil {
		t.Errorf("controller %v", err)
	}
	if diff := cmp.Diff(pod.Tolerations, tolerations, cmpopts.EquateEmpty()); diff != "" {
		t.Errorf("controller --agent-tolerations differ from the agent pods' tolerations (-pods +flag):\n%s", diff)
	}

	// The agent holds no Kubernetes credentials.
	if pod.AutomountServiceAccountToken == nil || *pod.AutomountServiceAccountToken {
		t.Errorf("agent pod automountServiceAccountToken is not false")
	}
	if sa := sas[pod.ServiceAccountName]; sa == nil || sa.AutomountServiceAccountToken == nil || *sa.AutomountServiceAccountToken {
		t.Errorf("agent ServiceAccount %s missing or with token automount", pod.ServiceAccountName)
	}
	for _, c := range []corev1.Container{ctrl, agent} {
		if c.LivenessProbe == nil || c.ReadinessProbe == nil {
			t.Errorf("container %s lacks a liveness or readiness probe", c.Name)
		}
	}
	hostPaths := map[string]string{}
	for _, v := range pod.Volumes {
		if v.HostPath != nil {
			hostPaths[v.Name] = v.HostPath.Path
		}
	}
	mounts := map[string]string{}
	for _, m := range agent.VolumeMounts {
		mounts[m.MountPath] = m.Name
	}
	stateDir := valueOr(flagValues(agent.Args), "state-dir", "/var/lib/bashtask-agent")
	if _, ok := hostPaths[mounts[stateDir]]; !ok {
		t.Errorf("agent --state-dir %s is not a hostPath volume", stateDir)
	}
	if valueOr(flagValues(agent.Args), "cgroups", "auto") != "off" && hostPaths[mounts["/sys/fs/cgroup"]] != "/sys/fs/cgroup" {
		t.Errorf("agent uses cgroups but does not mount the host's /sys/fs/cgroup")
	}
	if sc := ctrl.SecurityContext; sc == nil || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem ||
		sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation || sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot {
		t.Errorf("controller security context is not non-root, read-only, without privilege escalation: %+v", sc)
	}

	// cert-manager: the agents' certificate is valid for the server name
	// the controller checks, the controller's carries the identity the
	// agents accept.
	if len(certs) > 0 {
		identity := valueOr(flagValues(agent.Args), "controller-identity", "bashtask-controller")
		var serverOK, clientOK bool
		for _, c := range certs {
			dns, _, _ := unstructured.NestedStringSlice(c.Object, "spec", "dnsNames")
			cn, _, _ := unstructured.NestedString(c.Object, "spec", "commonName")
			usages, _, _ := unstructured.NestedStringSlice(c.Object, "spec", "usages")
			if slices.Contains(dns, serverName) && slices.Contains(usages, "server auth") {
				serverOK = true
			}
			if cn == identity && slices.Contains(usages, "client auth") {
				clientOK = true
			}
		}
		if !serverOK {
			t.Errorf("no Certificate with server auth for %s", serverName)
		}
		if !clientOK {
			t.Errorf("no Certificate with client auth and common name %s", identity)
		}
	}
}

func fromUnstructured(t *testing.T, u *unstructured.Unstructured, into any) {
	t.Helper()
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, into); err != nil {
		t.Fatalf("%s %s: %v", u.GetKind(), u.GetName(), err)
	}
}

// flagValues maps --name=value arguments to name -> value.
func flagValues(args []string) map[string]string {
	m := map[string]string{}
	for _, a := range args {
		if name, ok := strings.CutPrefix(a, "--"); ok {
			k, v, _ := strings.Cut(name, "=")
			m[k] = v
		}
	}
	return m
}

func valueOr(m map[string]string, k, def string) string {
	if v, ok := m[k]; ok && v != "" {
		return v
	}
	return def
}

func selects(selector, labels map[string]string) bool {
	if len(selector) == 0 {
		return false
	}
	for k, v := range selector {
		if labels[k] != v {
			return false
		}
	}
	return true
}

func keys[V any](m map[string]V) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}
