//go:build linux

// Package cluster tests the operator the way users run it: on a real
// one-node Kubernetes cluster (kubelet, containerd, runc, kube-proxy, a
// bridge CNI; internal/rig/nodecluster) with images built on this machine and
// the operator installed from its Helm chart. Each test is one promise of
// docs/install.md, checked from evidence the controller does not write:
// the node's processes, the bucket's files, the commands' own records.
//
// The suite needs root and the node binaries; run it with `make
// test-cluster`, which builds them.
package cluster

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/bashtask/bashtask-operator/api/v1alpha1"
	"github.com/bashtask/bashtask-operator/internal/rig/exampletasks"
	"github.com/bashtask/bashtask-operator/internal/rig/localcluster"
	"github.com/bashtask/bashtask-operator/internal/rig/nodecluster"
	"github.com/bashtask/bashtask-operator/internal/rig/nodeimages"
	"github.com/bashtask/bashtask-operator/internal/rig/testenv"
)

const (
	releaseName = "bashtask"
	releaseNS   = "bashtask-system"
	// The agent's bucket credentials: unused by the file bucket, present
	// in the agent's environment so the tests can check tasks never see
	// them.
	bucketKeyID  = "AKIACLUSTERTEST00001"
	bucketSecret = "cluster-test-secret-value-3b1f"
)

var (
	root    string
	cluster *nodecluster.Cluster
	k8s     client.Client
	cs      *kubernetes.Clientset
	// counter listens on the node's address: counting commands report each
	// execution to it, evidence of how often each command ran that no
	// component writes.
	counter *exampletasks.RunCounter
	tag     = "cluster-test"
)

func TestMain(m *testing.M) { os.Exit(run(m)) }

func run(m *testing.M) (code int) {
	ctx := context.Background()
	var err error
	if root, err = testenv.RepoRoot(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if os.Geteuid() != 0 {
		fmt.Fprintln(os.Stderr, "cluster: the suite runs a kubelet and containerd and needs root")
		return 1
	}
	for _, b := range []string{"kubectl-bashtask", "helm", "k8s/kubelet"} {
		if _, err := os.Stat(filepath.Join(root, "bin", b)); err != nil {
			fmt.Fprintf(os.Stderr, "cluster: %s is missing; run the suite through `make test-cluster`, which builds it\n", filepath.Join(root, "bin", b))
			return 1
		}
	}
	begin := time.Now()
	images, err := nodeimages.Build(ctx, nodeimages.Options{RepoRoot: root, OutDir: filepath.Join(root, "bin", "images"), Tag: tag, Log: os.Stderr})
	if err != nil {
		fmt.Fprintln(os.Stderr, "cluster: building the images:", err)
		return 1
	}
	fmt.Fprintf(os.Stderr, "cluster: images built in %.1fs\n", time.Since(begin).Seconds())
	opts := nodecluster.Options{Dir: filepath.Join(root, ".bashtask", "cluster"), BinDir: filepath.Join(root, "bin", "k8s")}
	for _, img := range images {
		opts.Images = append(opts.Images, nodecluster.Image{Ref: img.Ref, Archive: img.Archive})
		if img.Kind == nodeimages.Pause {
			opts.SandboxImage = img.Ref
		}
	}
	if cluster, err = nodecluster.New(opts); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if err := cluster.CheckNotUp(); err != nil {
		fmt.Fprintf(os.Stderr, "cluster: %v\n", err)
		return 1
	}
	defer func() {
		if code != 0 {
			cluster.Diagnose(ctx, os.Stderr)
			cluster.WriteLogTails(os.Stderr, 40)
		}
		if os.Getenv("CLUSTER_KEEP") == "1" {
			fmt.Fprintf(os.Stderr, "cluster: CLUSTER_KEEP=1: left running; export KUBECONFIG=%s\n", cluster.Kubeconfig())
			return
		}
		if err := cluster.Down(); err != nil {
			fmt.Fprintln(os.Stderr, "cluster: taking the cluster down:", err)
			code = 1
		}
	}()
	if err := cluster.Up(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "cluster:", err)
		return 1
	}
	if counter, err = exampletasks.NewRunCounter(cluster.NodeIP()); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer counter.Close()
	if err := install(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "cluster:", err)
		return 1
	}
	if err := connect(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "cluster:", err)
		return 1
	}
	fmt.Fprintf(os.Stderr, "cluster: up and installed in %.1fs\n", time.Since(begin).Seconds())
	return m.Run()
}

// install installs the chart as docs/install.md says, with the local images
// and bucket credentials in the agent's environment.
func install(ctx context.Context) error {
	secret := fmt.Sprintf(`apiVersion: v1
kind: Secret
metadata:
  name: bucket-credentials
  namespace: %s
stringData:
  AWS_ACCESS_KEY_ID: %s
  AWS_SECRET_ACCESS_KEY: %s
`, releaseNS, bucketKeyID, bucketSecret)
	return cluster.Install(ctx, nodecluster.Release{
		Name: releaseName, Namespace: releaseNS,
		Chart: filepath.Join(root, "charts", "bashtask"), Helm: filepath.Join(root, "bin", "helm"),
		Objects: []string{secret},
		Args:    releaseArgs(),
	})
}

// releaseArgs are the helm values of the suite's release.
func releaseArgs() []string {
	return []string{
		"-f", filepath.Join(root, "hack", "cluster", "values.yaml"),
		"--set", "controller.image.tag=" + tag, "--set", "agent.image.tag=" + tag,
		"--set", "agent.bucket.existingSecret=bucket-credentials",
		// Short enough for the tests that wait on it.
		"--set", "controller.progressInterval=500ms",
	}
}

func connect(ctx context.Context) error {
	cfg, err := cluster.RESTConfig()
	if err != nil {
		return err
	}
	scheme, err := localcluster.NewScheme()
	if err != nil {
		return err
	}
	if k8s, err = client.New(cfg, client.Options{Scheme: scheme}); err != nil {
		return err
	}
	if cs, err = kubernetes.NewForConfig(cfg); err != nil {
		return err
	}
	deadline := time.Now().Add(time.Minute)
	for {
		err := k8s.List(ctx, &v1.BashTaskList{}, client.Limit(1))
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return errors.Join(errors.New("BashTasks not served after a minute"), err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}
