// Package packaging_test checks what a cluster admin installs: the Helm
// chart (charts/bashtask) and the kustomize configuration (config/default)
// are rendered with the pinned helm and kustomize from bin/ (make tools),
// every rendered object is decoded strictly with the Kubernetes API types,
// validated by kubeconform against schemas generated from the test API
// server's OpenAPI document (which includes the BashTask CRD) and applied to
// that real kube-apiserver with a server-side dry run; the mTLS
// certificates the chart generates are checked with the binaries' own TLS
// code; and every path the Dockerfile copies exists.
package packaging_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/bashtask/bashtask-operator/internal/rig/testenv"
)

var (
	env  *testenv.Env
	root string
)

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	var err error
	if root, err = testenv.RepoRoot(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if env, err = testenv.Start(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer func() {
		if err := env.Stop(); err != nil {
			fmt.Fprintln(os.Stderr, "stopping the control plane:", err)
		}
	}()
	if err := apiextensionsv1.AddToScheme(env.Scheme); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := installStandInCRDs(ctx); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	// The namespaces the renderings use must exist for a dry run of their
	// namespaced objects.
	for _, ns := range []string{chartNamespace, "bashtask-system"} {
		obj := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}
		if err := env.Client.Create(ctx, obj); err != nil && !apierrors.IsAlreadyExists(err) {
			fmt.Fprintln(os.Stderr, "creating namespace:", err)
			return 1
		}
	}
	return m.Run()
}

// installStandInCRDs creates the cert-manager and prometheus-operator
// stand-in CRDs of testdata/crds and waits until they are served.
func installStandInCRDs(ctx context.Context) error {
	files, err := filepath.Glob(filepath.Join("testdata", "crds", "*.yaml"))
	if err != nil {
		return err
	}
	var names []string
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			return err
		}
		docs, err := splitYAML(data)
		if err != nil {
			return fmt.Errorf("%s: %w", f, err)
		}
		for _, doc := range docs {
			crd := &apiextensionsv1.CustomResourceDefinition{}
			if err := utilyaml.Unmarshal(doc, crd); err != nil {
				return fmt.Errorf("%s: %w", f, err)
			}
			if err := env.Client.Create(ctx, crd); err != nil {
				return fmt.Errorf("creating CRD %s: %w", crd.Name, err)
			}
			names = append(names, crd.Name)
		}
	}
	return wait.PollUntilContextCancel(ctx, 100*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		for _, name := range names {
			crd := &apiextensionsv1.CustomResourceDefinition{}
			if err := env.Client.Get(ctx, client.ObjectKey{Name: name}, crd); err != nil {
				return false, err
			}
			established := false
			for _, c := range crd.Status.Conditions {
				if c.Type == apiextensionsv1.Established && c.Status == apiextensionsv1.ConditionTrue {
					established = true
				}
			}
			if !established {
				return false, nil
			}
		}
		return true, nil
	})
}
