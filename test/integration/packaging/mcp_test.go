package packaging_test

import (
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/utils/ptr"
)

// mcpNamespace is the namespace the MCP server is rendered into, not the
// release's: the administrator picks it (mcp.namespace).
const mcpNamespace = "agents"

// TestMCPServerChart renders the chart with the MCP server over HTTP
// (mcp values, docs/mcp.md) and checks its objects: in the namespace the
// values pick, strict, valid for kubeconform and the API server, with
// flags `kubectl-bashtask mcp` defines, a Service in front of its port,
// and no credentials (no token mounted, no Role bound); without the
// values nothing of it is rendered, and without an owner the chart fails.
func TestMCPServerChart(t *testing.T) {
	helm := func(extra ...string) rendering {
		return rendering{cmd: append([]string{"helm", "template", chartRelease, "charts/bashtask", "--namespace", chartNamespace,
			"--kube-version", kubeVersion}, extra...)}
	}
	if objs := mcpObjects(render(t, helm())); len(objs) != 0 {
		t.Errorf("the default values render %d MCP server objects, want none (mcp.enabled is false)", len(objs))
	}
	cmd := exec.CommandContext(t.Context(), tool(t, "helm"), helm("--set", "mcp.enabled=true").cmd[1:]...)
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err == nil || !strings.Contains(string(out), "mcp.owner is required") {
		t.Errorf("mcp.enabled without mcp.owner: %v\n%s; want a failure naming mcp.owner", err, out)
	}

	all := render(t, helm("--set", "mcp.enabled=true", "--set", "mcp.owner=agent-7", "--set", "mcp.namespace="+mcpNamespace,
		"--set", "mcp.workspaceNamespace=team-a"))
	objs := mcpObjects(all)
	kinds := map[string]int{}
	for _, o := range objs {
		kinds[o.GetKind()]++
		if o.GetNamespace() != mcpNamespace {
			t.Errorf("%s %s in namespace %q, want mcp.namespace %q", o.GetKind(), o.GetName(), o.GetNamespace(), mcpNamespace)
		}
	}
	if kinds["ServiceAccount"] != 1 || kinds["Deployment"] != 1 || kinds["Service"] != 1 || len(objs) != 3 {
		t.Fatalf("MCP server objects %v, want a ServiceAccount, a Deployment and a Service", kinds)
	}
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: mcpNamespace}}
	if err := env.Client.Create(t.Context(), ns); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	t.Run("strict decoding", func(t *testing.T) { decodeStrict(t, objs) })
	t.Run("kubeconform", func(t *testing.T) { runKubeconform(t, kubeconformSchemas(t), objs) })
	t.Run("server-side dry run", func(t *testing.T) { dryRun(t, objs, mcpNamespace) })
	t.Run("wiring", func(t *testing.T) { checkMCPWiring(t, all, objs) })
	t.Run("flags", func(t *testing.T) { checkMCPFlags(t, objs) })
}

// mcpObjects are the objects of the MCP server's component.
func mcpObjects(objs []*unstructured.Unstructured) []*unstructured.Unstructured {
	var out []*unstructured.Unstructured
	for _, o := range objs {
		if o.GetLabels()["app.kubernetes.io/component"] == "mcp" {
			out = append(out, o)
		}
	}
	return out
}

// checkMCPWiring: the Service reaches the server's port, the server gets
// the values' owner and namespace, the API server's CA from
// kube-root-ca.crt and no credentials of its own.
func checkMCPWiring(t *testing.T, all, objs []*unstructured.Unstructured) {
	t.Helper()
	var (
		deploy appsv1.Deployment
		svc    corev1.Service
		sa     corev1.ServiceAccount
	)
	for _, o := range objs {
		switch o.GetKind() {
		case "Deployment":
			fromUnstructured(t, o, &deploy)
		case "Service":
			fromUnstructured(t, o, &svc)
		case "ServiceAccount":
			fromUnstructured(t, o, &sa)
		}
	}
	pod := deploy.Spec.Template.Spec
	c := pod.Containers[0]
	flags := flagValues(c.Args)
	if len(c.Args) == 0 || c.Args[0] != "mcp" || flags["owner"] != "agent-7" || flags["namespace"] != "team-a" || flags["server"] == "" {
		t.Errorf("server arguments %v: want mcp --owner=agent-7 --namespace=team-a --server=...", c.Args)
	}
	if !strings.HasSuffix(strings.Split(c.Image, ":")[0], "/bashtask-mcp") {
		t.Errorf("image %s, want the bashtask-mcp image (Dockerfile target mcp)", c.Image)
	}
	if len(c.Ports) != 1 || flags["http"] != ":"+itoa(c.Ports[0].ContainerPort) {
		t.Errorf("--http=%s, container ports %+v", flags["http"], c.Ports)
	}
	if !selects(svc.Spec.Selector, deploy.Spec.Template.Labels) || len(svc.Spec.Ports) != 1 || svc.Spec.Ports[0].TargetPort.StrVal != c.Ports[0].Name {
		t.Errorf("Service %s (selector %v, ports %+v) does not reach the server's port %+v", svc.Name, svc.Spec.Selector, svc.Spec.Ports, c.Ports)
	}
	checkMCPCA(t, pod, c, flags["certificate-authority"])
	if pod.ServiceAccountName != sa.Name || !ptrFalse(pod.AutomountServiceAccountToken) || !ptrFalse(sa.AutomountServiceAccountToken) {
		t.Errorf("pod ServiceAccount %s (automount %v), ServiceAccount %s (automount %v): want the chart's, no token mounted",
			pod.ServiceAccountName, pod.AutomountServiceAccountToken, sa.Name, sa.AutomountServiceAccountToken)
	}
	for _, o := range all {
		if k := o.GetKind(); k != "RoleBinding" && k != "ClusterRoleBinding" {
			continue
		}
		subjects, _, _ := unstructuredSlice(o.Object, "subjects")
		for _, s := range subjects {
			if m, _ := s.(map[string]any); m["kind"] == rbacv1.ServiceAccountKind && m["name"] == sa.Name {
				t.Errorf("%s %s binds the MCP server's ServiceAccount: it needs no rights of its own", o.GetKind(), o.GetName())
			}
		}
	}
	if sc := c.SecurityContext; sc == nil || !ptr.Deref(sc.ReadOnlyRootFilesystem, false) || ptr.Deref(sc.AllowPrivilegeEscalation, true) || !ptr.Deref(sc.RunAsNonRoot, false) {
		t.Errorf("security context is not non-root, read-only, without privilege escalation: %+v", sc)
	}
}

// checkMCPCA: the --certificate-authority file is the ca.crt of a volume
// of the kube-root-ca.crt ConfigMap.
func checkMCPCA(t *testing.T, pod corev1.PodSpec, c corev1.Container, caFile string) {
	t.Helper()
	for _, m := range c.VolumeMounts {
		if filepath.Join(m.MountPath, "ca.crt") != caFile {
			continue
		}
		for _, v := range pod.Volumes {
			if v.Name == m.Name && v.ConfigMap != nil && v.ConfigMap.Name == "kube-root-ca.crt" {
				return
			}
		}
	}
	t.Errorf("--certificate-authority=%s is not ca.crt of a kube-root-ca.crt ConfigMap volume (mounts %+v)", caFile, c.VolumeMounts)
}

func ptrFalse(b *bool) bool { return b != nil && !*b }

func itoa(i int32) string { return strconv.Itoa(int(i)) }

// checkMCPFlags: every flag the chart passes is one `kubectl-bashtask mcp
// --help` lists (its own or the kubectl flags it inherits).
func checkMCPFlags(t *testing.T, objs []*unstructured.Unstructured) {
	bin := filepath.Join(t.TempDir(), "kubectl-bashtask")
	build := exec.CommandContext(t.Context(), "go", "build", "-o", bin, "./cmd/kubectl-bashtask")
	build.Dir = root
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	out, err := exec.CommandContext(t.Context(), bin, "mcp", "--help").CombinedOutput()
	if err != nil {
		t.Fatalf("kubectl-bashtask mcp --help: %v\n%s", err, out)
	}
	known := map[string]bool{}
	for _, m := range regexp.MustCompile(`(?m)^\s+(?:-\w, )?--([a-z0-9-]+)`).FindAllStringSubmatch(string(out), -1) {
		known[m[1]] = true
	}
	for _, o := range objs {
		containers, _, _ := unstructuredSlice(o.Object, "spec", "template", "spec", "containers")
		for _, c := range containers {
			args, _ := c.(map[string]any)["args"].([]any)
			for _, a := range args {
				s, _ := a.(string)
				for name := range flagValues([]string{s}) {
					if !known[name] {
						t.Errorf("the MCP server's Deployment passes --%s, which kubectl-bashtask mcp does not define", name)
					}
				}
			}
		}
	}
}
