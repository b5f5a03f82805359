package api_test

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/bashtask/bashtask-operator/api/v1alpha1"
)

// kubectl runs the kubectl of KUBEBUILDER_ASSETS (the one `make envtest`
// builds) against the test's API server, as a GitOps tool or a user would.
func kubectl(t *testing.T, stdin string, args ...string) (stdout, stderr string, err error) {
	t.Helper()
	kc, err := writeKubeconfig(t.TempDir(), env.Config)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.CommandContext(t.Context(), filepath.Join(os.Getenv("KUBEBUILDER_ASSETS"), "kubectl"), append([]string{"--kubeconfig", kc}, args...)...)
	cmd.Stdin = strings.NewReader(stdin)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err = cmd.Run()
	return out.String(), errOut.String(), err
}

// writeKubeconfig writes an administrator's kubeconfig for cfg into dir.
func writeKubeconfig(dir string, cfg *rest.Config) (string, error) {
	kc := clientcmdapi.NewConfig()
	kc.Clusters["env"] = &clientcmdapi.Cluster{Server: cfg.Host, CertificateAuthorityData: cfg.CAData}
	kc.AuthInfos["admin"] = &clientcmdapi.AuthInfo{ClientCertificateData: cfg.CertData, ClientKeyData: cfg.KeyData, Token: cfg.BearerToken}
	kc.Contexts["env"] = &clientcmdapi.Context{Cluster: "env", AuthInfo: "admin"}
	kc.CurrentContext = "env"
	path := filepath.Join(dir, "kubeconfig")
	if err := clientcmd.WriteToFile(*kc, path); err != nil {
		return "", fmt.Errorf("writing %s: %w", path, err)
	}
	return path, nil
}

// manifest is a BashTask as it would be in Git.
func manifest(ns, name, command string, defaults bool) string {
	m := fmt.Sprintf(`apiVersion: bashtask.dev/v1alpha1
kind: BashTask
metadata:
  name: %s
  namespace: %s
spec:
  command: %q
`, name, ns, command)
	if defaults {
		m += fmt.Sprintf("  timeoutSeconds: %d\n  killGracePeriodSeconds: %d\n", v1.DefaultTimeoutSeconds, v1.DefaultKillGracePeriodSeconds)
	}
	return m
}

// TestReapplyIsNoOp checks that applying the manifest a task was created
// from again, as every GitOps sync does, changes nothing: same UID, same
// generation, same resourceVersion, so the controller has nothing to run.
func TestReapplyIsNoOp(t *testing.T) {
	ns := newNamespace(t)
	applies := map[string][]string{
		"client-side apply (Argo CD's default)": {"apply", "-f", "-"},
		"server-side apply (Flux)":              {"apply", "--server-side", "--field-manager=kustomize-controller", "-f", "-"},
	}
	i := 0
	for how, args := range applies {
		for _, defaults := range []bool{false, true} {
			i++
			name := fmt.Sprintf("reapply-%d", i)
			t.Run(fmt.Sprintf("%s, defaulted fields in the manifest %v", how, defaults), func(t *testing.T) {
				m := manifest(ns, name, "echo once", defaults)
				if _, stderr, err := kubectl(t, m, args...); err != nil {
					t.Fatalf("first apply: %v: %s", err, stderr)
				}
				before := &v1.BashTask{}
				if err := env.Client.Get(t.Context(), client.ObjectKey{Namespace: ns, Name: name}, before); err != nil {
					t.Fatal(err)
				}
				// The controller's writes happen between syncs: a status
				// and the finalizer must not turn the next apply into a
				// change either.
				before.Status = v1.BashTaskStatus{Phase: ptr.To(v1.PhaseSucceeded), Reason: ptr.To(v1.ReasonSucceeded), ObservedGeneration: ptr.To(before.Generation)}
				if err := env.Client.Status().Update(t.Context(), before); err != nil {
					t.Fatal(err)
				}
				for range 2 {
					if _, stderr, err := kubectl(t, m, args...); err != nil {
						t.Fatalf("re-apply: %v: %s", err, stderr)
					}
				}
				after := &v1.BashTask{}
				if err := env.Client.Get(t.Context(), client.ObjectKey{Namespace: ns, Name: name}, after); err != nil {
					t.Fatal(err)
				}
				if after.UID != before.UID || after.Generation != before.Generation || after.ResourceVersion != before.ResourceVersion {
					t.Errorf("re-apply changed the task: uid %s→%s generation %d→%d resourceVersion %s→%s",
						before.UID, after.UID, before.Generation, after.Generation, before.ResourceVersion, after.ResourceVersion)
				}
			})
		}
	}
}

// TestEditedCommandIsRefused checks C39 and what a GitOps sync of an
// edited command meets: a 422 whose message says the field is immutable
// and how to run a new command.
func TestEditedCommandIsRefused(t *testing.T) {
	ns := newNamespace(t)
	if _, stderr, err := kubectl(t, manifest(ns, "x", "echo v1", false), "apply", "-f", "-"); err != nil {
		t.Fatalf("apply: %v: %s", err, stderr)
	}
	edits := map[string][]string{
		"kubectl patch (C39)": {"patch", "-n", ns, "bt", "x", "--type=merge", "-p", `{"spec":{"command":"echo v2"}}`},
		"client-side apply":   {"apply", "-f", "-"},
		"server-side apply":   {"apply", "--server-side", "--field-manager=kustomize-controller", "--force-conflicts", "-f", "-"},
	}
	for how, args := range edits {
		t.Run(how, func(t *testing.T) {
			_, stderr, err := kubectl(t, manifest(ns, "x", "echo v2", false), args...)
			if err == nil {
				t.Fatal("the edit was accepted")
			}
			for _, want := range []string{"is invalid", "spec.command is immutable", "create a task with a new name", "Force=true,Replace=true", "BeforeHookCreation", "kustomize.toolkit.fluxcd.io/force: enabled"} {
				if !strings.Contains(stderr, want) {
					t.Errorf("kubectl's error does not say %q:\n%s", want, stderr)
				}
			}
		})
	}
	got := &v1.BashTask{}
	if err := env.Client.Get(t.Context(), client.ObjectKey{Namespace: ns, Name: "x"}, got); err != nil {
		t.Fatal(err)
	}
	if got.Spec.Command != "echo v1" || got.Generation != 1 {
		t.Errorf("command %q generation %d after refused edits, want %q 1", got.Spec.Command, got.Generation, "echo v1")
	}
}

// TestCreateWarnings checks the ValidatingAdmissionPolicy of
// config/admission/warning-policy.yaml: the task is created, and kubectl
// shows a warning, for a TTL on a task Argo CD or Flux manages and for env
// names bash cannot expand.
func TestCreateWarnings(t *testing.T) {
	ns := newNamespace(t)
	task := func(name, meta, spec string) string {
		return fmt.Sprintf("apiVersion: bashtask.dev/v1alpha1\nkind: BashTask\nmetadata:\n  name: %s\n  namespace: %s\n%sspec:\n  command: \"printenv\"\n%s", name, ns, meta, spec)
	}
	const ttl = "  ttlSecondsAfterFinished: 60\n"
	tests := map[string]struct {
		manifest     string
		wantWarnings []string // substrings, one warning each; none: no warning
	}{
		"plain task":            {manifest: task("plain", "", "")},
		"TTL, unmanaged":        {manifest: task("ttl", "", ttl)},
		"managed, no TTL":       {manifest: task("argo-no-ttl", "  annotations:\n    argocd.argoproj.io/tracking-id: app:bashtask.dev/BashTask:ns/x\n", "")},
		"TTL, Argo CD tracking": {manifest: task("argo-ttl", "  annotations:\n    argocd.argoproj.io/tracking-id: app:bashtask.dev/BashTask:ns/x\n", ttl), wantWarnings: []string{"spec.ttlSecondsAfterFinished has no effect on a task Argo CD or Flux manages"}},
		"TTL, Argo CD label":    {manifest: task("argo-label-ttl", "  labels:\n    app.kubernetes.io/instance: app\n", ttl), wantWarnings: []string{"spec.ttlSecondsAfterFinished has no effect"}},
		"TTL, Flux":             {manifest: task("flux-ttl", "  labels:\n    kustomize.toolkit.fluxcd.io/name: tasks\n", ttl), wantWarnings: []string{"spec.ttlSecondsAfterFinished has no effect"}},
		"expandable env names":  {manifest: task("env-ok", "", "  env:\n  - name: _A1\n    value: \"x\"\n  - name: b\n    value: \"y\"\n")},
		"unexpandable env names": {
			manifest:     task("env-bad", "", "  env:\n  - name: 1BAD\n    value: \"x\"\n  - name: A B\n    value: \"y\"\n  - name: OK\n    value: \"z\"\n"),
			wantWarnings: []string{`spec.env: "1BAD", "A B" cannot be expanded by bash as a variable`},
		},
		"both": {
			manifest:     task("both", "  labels:\n    kustomize.toolkit.fluxcd.io/name: tasks\n", ttl+"  env:\n  - name: a-b\n    value: \"x\"\n"),
			wantWarnings: []string{"spec.ttlSecondsAfterFinished has no effect", `spec.env: "a-b" cannot be expanded`},
		},
	}
	// A new policy takes effect a moment after it is created: wait until a
	// dry run shows its warning.
	deadline := time.Now().Add(30 * time.Second)
	for {
		_, stderr, err := kubectl(t, tests["unexpandable env names"].manifest, "create", "--dry-run=server", "-f", "-")
		if err == nil && strings.Contains(stderr, "cannot be expanded") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the warning policy is not in effect after 30s: %v: %s", err, stderr)
		}
		time.Sleep(200 * time.Millisecond)
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			stdout, stderr, err := kubectl(t, tc.manifest, "create", "-f", "-")
			if err != nil || !strings.Contains(stdout, "created") {
				t.Fatalf("create: %v: %s%s", err, stdout, stderr)
			}
			warnings := 0
			for _, l := range strings.Split(stderr, "\n") {
				if strings.HasPrefix(l, "Warning: ") {
					warnings++
				}
			}
			if warnings != len(tc.wantWarnings) {
				t.Errorf("%d warnings, want %d:\n%s", warnings, len(tc.wantWarnings), stderr)
			}
			for _, want := range tc.wantWarnings {
				if !strings.Contains(stderr, want) {
					t.Errorf("no warning %q:\n%s", want, stderr)
				}
			}
		})
	}
}
