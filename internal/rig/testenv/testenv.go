// Package testenv starts a real kube-apiserver and etcd for integration
// tests, with the project's generated CRDs installed.
//
// The binaries come from KUBEBUILDER_ASSETS, which `make test` points at
// bin/k8s (built by hack/setup-envtest.sh). A missing directory is an error,
// never a skipped test: integration tests that silently do not run would
// report a green build for code nobody tested.
package testenv

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/bashtask/bashtask-operator/internal/rig/localcluster"
)

// Env is a running control plane: a kube-apiserver and its etcd.
type Env struct {
	// Config reaches the API server as a cluster administrator.
	Config *rest.Config
	// Client is an uncached client for the built-in and BashTask types.
	Client client.Client
	// Scheme knows the built-in types and bashtask.dev/v1alpha1.
	Scheme *runtime.Scheme

	env *envtest.Environment
}

// Start launches etcd and kube-apiserver from KUBEBUILDER_ASSETS and
// installs config/crd/bases and config/admission, and returns once the API
// server accepts BashTasks. It returns an error naming the fix when the
// binaries or the CRDs are missing.
func Start() (*Env, error) {
	return StartWith(nil)
}

// StartWith is Start with kube-apiserver's front proxy set up from certs
// (nil: none), so that it can proxy requests to an aggregated API server
// such as output.bashtask.dev (localcluster.StartControlPlaneWith).
func StartWith(certs *localcluster.Certs) (*Env, error) {
	assets := os.Getenv("KUBEBUILDER_ASSETS")
	if assets == "" {
		return nil, errors.New("KUBEBUILDER_ASSETS is not set: run the tests through `make test` or set it to the output of hack/setup-envtest.sh")
	}
	for _, bin := range []string{"kube-apiserver", "etcd"} {
		if _, err := os.Stat(filepath.Join(assets, bin)); err != nil {
			return nil, fmt.Errorf("control-plane binary %s missing in KUBEBUILDER_ASSETS=%s (run hack/setup-envtest.sh): %w", bin, assets, err)
		}
	}
	root, err := RepoRoot()
	if err != nil {
		return nil, err
	}

	// The admission policies ship with the CRD; tests see the API as a
	// cluster with the operator installed has it.
	cp, err := localcluster.StartControlPlaneWith(context.Background(), assets,
		filepath.Join(root, "config", "crd", "bases"), filepath.Join(root, "config", "admission"), certs)
	if err != nil {
		return nil, err
	}
	return &Env{Config: cp.Config, Client: cp.Client, Scheme: cp.Scheme, env: cp.Env}, nil
}

// Stop shuts the API server and etcd down and removes their data.
func (e *Env) Stop() error {
	return e.env.Stop()
}

// RepoRoot returns the directory holding the module's go.mod, searched
// upwards from the working directory (a package directory under go test).
func RepoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", fmt.Errorf("finding the repository root: %w", err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("finding the repository root: no go.mod above the working directory")
		}
		dir = parent
	}
}

// WriteKubeconfig writes a kubeconfig for a new cluster administrator
// (group system:masters) to path, for processes a test starts.
func (e *Env) WriteKubeconfig(path string) error {
	user, err := e.env.AddUser(envtest.User{Name: "bashtask-test-admin", Groups: []string{"system:masters"}}, e.Config)
	if err != nil {
		return fmt.Errorf("creating the administrator: %w", err)
	}
	raw, err := user.KubeConfig()
	if err != nil {
		return err
	}
	return os.WriteFile(path, raw, 0o600)
}
