// Package plugin_test runs kubectl-bashtask's commands in-process against a
// real kube-apiserver, the controller, two agents and the output API behind
// kube-apiserver's front proxy (internal/rig/testrig), through a kubeconfig
// file as a user would.
package plugin_test

import (
	"bytes"
	"cmp"
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/cli-runtime/pkg/genericiooptions"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"sigs.k8s.io/controller-runtime/pkg/client"

	bashtaskv1alpha1 "github.com/bashtask/bashtask-operator/api/v1alpha1"
	"github.com/bashtask/bashtask-operator/cmd/kubectl-bashtask/plugin"
	"github.com/bashtask/bashtask-operator/controllers"
	"github.com/bashtask/bashtask-operator/internal/rig/testrig"
)

var (
	rig        *testrig.Rig
	kubeconfig string
)

func TestMain(m *testing.M) {
	opts := controllers.DefaultOptions()
	// Frequent progress writes, so that run and logs -f see a running
	// task's tails grow, as they would over a longer task in a cluster.
	opts.ProgressInterval = 200 * time.Millisecond
	opts.RetryInterval = 500 * time.Millisecond
	var err error
	if rig, err = testrig.Start(testrig.Options{Controller: &opts, OutputAPI: true}); err != nil {
		fmt.Fprintln(os.Stderr, "starting the test rig:", err)
		os.Exit(1)
	}
	code := 1
	if kubeconfig, err = writeKubeconfig(rig.Dir, rig.Env.Config); err != nil {
		fmt.Fprintln(os.Stderr, "writing the kubeconfig:", err)
	} else {
		code = m.Run()
	}
	rig.Stop()
	os.Exit(code)
}

// writeKubeconfig writes a kubeconfig for the rig's API server, so the
// plugin loads its credentials the way it does for a user.
func writeKubeconfig(dir string, cfg *rest.Config) (string, error) {
	kc := clientcmdapi.NewConfig()
	kc.Clusters["rig"] = &clientcmdapi.Cluster{Server: cfg.Host, CertificateAuthorityData: cfg.CAData}
	kc.AuthInfos["admin"] = &clientcmdapi.AuthInfo{ClientCertificateData: cfg.CertData, ClientKeyData: cfg.KeyData, Token: cfg.BearerToken}
	kc.Contexts["rig"] = &clientcmdapi.Context{Cluster: "rig", AuthInfo: "admin", Namespace: "default"}
	kc.CurrentContext = "rig"
	path := filepath.Join(dir, "kubeconfig")
	if err := clientcmd.WriteToFile(*kc, path); err != nil {
		return "", fmt.Errorf("writing %s: %w", path, err)
	}
	return path, nil
}

// result is what one plugin invocation did.
type result struct {
	code           int
	stdout, stderr string
}

// invocation configures one run of the plugin.
type invocation struct {
	stdin      io.Reader
	interrupts chan os.Signal
	// stdout and stderr, when set, take the plugin's stdout and stderr
	// instead of the result.
	stdout, stderr io.Writer
	// timeout bounds the invocation; 0 means 60 s.
	timeout time.Duration
}

// kubectlBashtask runs the plugin with args in namespace ns.
func kubectlBashtask(t *testing.T, ns string, args ...string) result {
	t.Helper()
	return invocation{}.run(t, ns, args...)
}

func (inv invocation) run(t *testing.T, ns string, args ...string) result {
	t.Helper()
	if inv.stdin == nil {
		inv.stdin = strings.NewReader("")
	}
	var out, errOut bytes.Buffer
	opts := plugin.Options{IOStreams: genericiooptions.IOStreams{In: inv.stdin, Out: &out, ErrOut: &errOut}}
	if inv.stdout != nil {
		opts.IOStreams.Out = inv.stdout
	}
	if inv.stderr != nil {
		opts.IOStreams.ErrOut = inv.stderr
	}
	if inv.interrupts != nil {
		opts.Interrupts = inv.interrupts
	}
	full := append([]string{"--kubeconfig", kubeconfig, "-n", ns}, args...)
	ctx, cancel := context.WithTimeout(t.Context(), cmp.Or(inv.timeout, 60*time.Second))
	defer cancel()
	code := plugin.Main(ctx, opts, full)
	return result{code: code, stdout: out.String(), stderr: errOut.String()}
}

// newNamespace creates a namespace for one test. Nothing deletes it: no
// kube-controller-manager runs to finish a namespace deletion.
func newNamespace(t *testing.T) string {
	t.Helper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "plugin-"}}
	if err := rig.Client.Create(t.Context(), ns); err != nil {
		t.Fatalf("creating a namespace: %v", err)
	}
	return ns.Name
}

// getTask reads a task through the rig's own client.
func getTask(t *testing.T, ns, name string) *bashtaskv1alpha1.BashTask {
	t.Helper()
	bt := &bashtaskv1alpha1.BashTask{}
	if err := rig.Client.Get(t.Context(), client.ObjectKey{Namespace: ns, Name: name}, bt); err != nil {
		t.Fatalf("reading task %s/%s: %v", ns, name, err)
	}
	return bt
}

func objectKey(ns, name string) client.ObjectKey { return client.ObjectKey{Namespace: ns, Name: name} }
