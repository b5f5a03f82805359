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
	"slices"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/bashtask/bashtask-operator/api/v1alpha1"
	"github.com/bashtask/bashtask-operator/internal/rig/exampletasks"
	"github.com/bashtask/bashtask-operator/internal/rig/localcluster"
	"github.com/bashtask/bashtask-operator/internal/rig/nodecluster"
	"github.com/bashtask/bashtask-operator/internal/rig/nodeimages"
	"github.com/bashtask/bashtask-operator/internal/rig/registry"
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
	// built are the images of the run, by kind.
	built map[nodeimages.Kind]nodeimages.Image
	// registryHost is the in-cluster registry's HOST:PORT; taskSmallRef,
	// privateRef and taskRef its images (by tag) that the tests name.
	registryHost, taskSmallRef, privateRef, taskRef string
	// digests are the digests of those references, as pushed.
	digests = map[string]string{}
)

// imageKinds are the images the suite builds: the node's, the in-cluster
// registry's and the task images it serves.
func imageKinds() []nodeimages.Kind {
	return append(append(nodeimages.Kinds(), nodeimages.Registry), nodeimages.TaskKinds()...)
}

// startRegistry starts the in-cluster registry and pushes the task images
// to it: task-small twice (bashtask/task-small and, wanting the test's
// credentials, bashtask/private/task-small) and the Task image, the
// release's default image (bashtask/bashtask-task).
func startRegistry(ctx context.Context) error {
	var err error
	if registryHost, err = cluster.RegistryHost(); err != nil {
		return err
	}
	if err := cluster.StartRegistry(ctx, built[nodeimages.Registry].Ref); err != nil {
		return err
	}
	small, task := built[nodeimages.TaskSmall], built[nodeimages.Task]
	creds := &authn.Basic{Username: registry.TestUser, Password: registry.TestPassword}
	for _, p := range []struct {
		img  nodeimages.Image
		repo string
		auth authn.Authenticator
		ref  *string
	}{
		{small, "bashtask/task-small", nil, &taskSmallRef},
		{small, "bashtask/private/task-small", creds, &privateRef},
		{task, "bashtask/bashtask-task", nil, &taskRef},
	} {
		byDigest, err := cluster.PushToRegistry(ctx, p.img.Archive, p.img.Ref, p.repo, tag, p.auth)
		if err != nil {
			return err
		}
		*p.ref = registryHost + "/" + p.repo + ":" + tag
		digests[*p.ref] = digestOf(byDigest)
	}
	return nil
}

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
	images, err := nodeimages.Build(ctx, nodeimages.Options{RepoRoot: root, OutDir: filepath.Join(root, "bin", "images"), Tag: tag, Log: os.Stderr, Only: imageKinds()})
	if err != nil {
		fmt.Fprintln(os.Stderr, "cluster: building the images:", err)
		return 1
	}
	fmt.Fprintf(os.Stderr, "cluster: images built in %.1fs\n", time.Since(begin).Seconds())
	opts := nodecluster.Options{Dir: filepath.Join(root, ".bashtask", "cluster"), BinDir: filepath.Join(root, "bin", "k8s")}
	built = map[nodeimages.Kind]nodeimages.Image{}
	for _, img := range images {
		built[img.Kind] = img
		if slices.Contains(nodeimages.TaskKinds(), img.Kind) {
			continue // pulled by the agent from the in-cluster registry
		}
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
	if err := startRegistry(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "cluster:", err)
		return 1
	}
	if err := install(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "cluster:", err)
		return 1
	}
	if err := connect(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "cluster:", err)
		return 1
	}
	if err := warmDefaultImage(ctx); err != nil {
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
		// The chart's default image of tasks, from the in-cluster registry
		// (docs/install.md, "Images").
		"--set", "agent.images.defaultImage.repository=" + registryHost + "/bashtask/bashtask-task",
		"--set", "agent.images.defaultImage.tag=" + tag,
		"--set", "agent.images.insecureRegistries={" + registryHost + "}",
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

// warmDefaultImage runs a task without an image and waits up to 3 minutes
// for it to succeed, so that the node pulls the chart's default image
// (the Task image, about 94 MB compressed) once, before the tests whose
// tasks wait a minute at most; it logs how long that took.
func warmDefaultImage(ctx context.Context) error {
	begin := time.Now()
	bt := &v1.BashTask{}
	bt.Namespace, bt.Name = "default", "warm-default-image"
	bt.Spec.Command = "true"
	if err := k8s.Create(ctx, bt); err != nil {
		return fmt.Errorf("creating %s: %w", bt.Name, err)
	}
	defer func() { _ = k8s.Delete(context.WithoutCancel(ctx), bt) }()
	deadline := time.Now().Add(3 * time.Minute)
	for {
		got := &v1.BashTask{}
		if err := k8s.Get(ctx, client.ObjectKeyFromObject(bt), got); err != nil {
			return err
		}
		if r := got.Status.Reason; r != nil {
			if *r != v1.ReasonSucceeded {
				return fmt.Errorf("task %s in the default image %s ended %s: %s", bt.Name, taskRef, *r, ptr.Deref(got.Status.Message, ""))
			}
			fmt.Fprintf(os.Stderr, "cluster: the first task in the default image %s took %.1fs (the pull)\n", taskRef, time.Since(begin).Seconds())
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("task %s in the default image %s not done after 3 minutes: %+v", bt.Name, taskRef, got.Status)
		}
		time.Sleep(500 * time.Millisecond)
	}
}
