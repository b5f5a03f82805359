package localcluster

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	bashtaskv1alpha1 "github.com/bashtask/bashtask-operator/api/v1alpha1"
)

// ControlPlane is a running etcd and kube-apiserver with the BashTask CRD
// and the admission policies installed, ready to accept tasks.
type ControlPlane struct {
	// Config reaches the API server as a cluster administrator.
	Config *rest.Config
	// Client is an uncached client for the built-in and BashTask types.
	Client client.Client
	// Scheme knows the built-in types and bashtask.dev/v1alpha1.
	Scheme *runtime.Scheme
	// Env is the envtest environment that runs the processes; AddUser
	// makes kubeconfigs for it.
	Env *envtest.Environment
}

// NewScheme returns a scheme with the built-in types and
// bashtask.dev/v1alpha1.
func NewScheme() (*runtime.Scheme, error) {
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		return nil, fmt.Errorf("registering built-in types: %w", err)
	}
	if err := bashtaskv1alpha1.AddToScheme(scheme); err != nil {
		return nil, fmt.Errorf("registering bashtask.dev/v1alpha1: %w", err)
	}
	return scheme, nil
}

// StartControlPlane starts etcd and kube-apiserver from assetsDir, installs
// the CRDs of crdDir and the admission policies of admissionDir (none when
// empty), and waits until the API server accepts a BashTask. On error
// nothing it started is left running.
func StartControlPlane(ctx context.Context, assetsDir, crdDir, admissionDir string) (*ControlPlane, error) {
	return StartControlPlaneWith(ctx, assetsDir, crdDir, admissionDir, nil)
}

// StartControlPlaneWith is StartControlPlane with kube-apiserver's front
// proxy set up from certs (nil: none): the requestheader flags that let
// it proxy requests to aggregated API servers as the requesting user, and
// aggregator routing to endpoints, since no kube-proxy turns a Service's
// cluster IP into them here.
func StartControlPlaneWith(ctx context.Context, assetsDir, crdDir, admissionDir string, certs *Certs) (*ControlPlane, error) {
	scheme, err := NewScheme()
	if err != nil {
		return nil, err
	}
	env := &envtest.Environment{
		BinaryAssetsDirectory: assetsDir,
		CRDDirectoryPaths:     []string{crdDir},
		ErrorIfCRDPathMissing: true,
		Scheme:                scheme,
		// envtest waits for each process's health check, but only 20 s
		// by default: kube-apiserver alone can take longer than that on
		// a two-core machine that is building and testing at the same
		// time. KUBEBUILDER_CONTROLPLANE_START_TIMEOUT still overrides.
		ControlPlaneStartTimeout: controlPlaneStartTimeout(),
	}
	if certs != nil {
		args := env.ControlPlane.GetAPIServer().Configure()
		args.Set("requestheader-client-ca-file", certs.FrontProxyCAFile)
		args.Set("requestheader-allowed-names", FrontProxyClientName)
		args.Set("requestheader-username-headers", "X-Remote-User")
		args.Set("requestheader-group-headers", "X-Remote-Group")
		args.Set("requestheader-extra-headers-prefix", "X-Remote-Extra-")
		args.Set("proxy-client-cert-file", certs.FrontProxyCertFile)
		args.Set("proxy-client-key-file", certs.FrontProxyKeyFile)
		args.Set("enable-aggregator-routing", "true")
	}
	cfg, err := env.Start()
	if err != nil {
		// Start fails after launching the processes when, say, a CRD is
		// refused; stop them so no etcd or kube-apiserver outlives us.
		return nil, errors.Join(fmt.Errorf("starting kube-apiserver and etcd from %s: %w", assetsDir, err), env.Stop())
	}
	cp := &ControlPlane{Config: cfg, Scheme: scheme, Env: env}
	if err := cp.prepare(ctx, admissionDir); err != nil {
		return nil, errors.Join(err, env.Stop())
	}
	return cp, nil
}

// controlPlaneStartTimeout is how long etcd and kube-apiserver each get to
// become healthy: KUBEBUILDER_CONTROLPLANE_START_TIMEOUT when set (envtest's
// own variable), else 2 minutes.
func controlPlaneStartTimeout() time.Duration {
	if d, err := time.ParseDuration(os.Getenv("KUBEBUILDER_CONTROLPLANE_START_TIMEOUT")); err == nil && d > 0 {
		return d
	}
	return 2 * time.Minute
}

func (cp *ControlPlane) prepare(ctx context.Context, admissionDir string) error {
	c, err := client.New(cp.Config, client.Options{Scheme: cp.Scheme})
	if err != nil {
		return fmt.Errorf("creating a client: %w", err)
	}
	cp.Client = c
	if admissionDir != "" {
		if err := InstallManifests(ctx, c, admissionDir); err != nil {
			return fmt.Errorf("installing the admission policies: %w", err)
		}
	}
	return WaitAcceptsTasks(ctx, c, 60*time.Second)
}

// Stop ends kube-apiserver and etcd and removes their data.
func (cp *ControlPlane) Stop() error {
	return cp.Env.Stop()
}
