//go:build linux

// Command cluster starts and stops the one-node cluster of
// hack/cluster.sh: it builds the images, starts the node
// (internal/rig/nodecluster) and a registry inside it that serves the task
// images, installs the operator from the Helm chart as docs/install.md
// tells users (the registry's Task image as agent.images.defaultImage),
// and prints the KUBECONFIG to use. `down`
// stops everything and puts the host back as it was.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/bashtask/bashtask-operator/internal/rig/nodecluster"
	"github.com/bashtask/bashtask-operator/internal/rig/nodeimages"
)

func main() {
	if err := newRootCommand().Execute(); err != nil {
		fmt.Fprintln(os.Stderr, "cluster:", err)
		os.Exit(1)
	}
}

type options struct {
	dir, binDir, imagesDir, tag string
	install                     bool
	helm, chart, values         string
	release, namespace          string
}

func newRootCommand() *cobra.Command {
	o := &options{}
	root := &cobra.Command{
		Use:           "cluster",
		Short:         "A one-node Kubernetes cluster (kubelet, containerd, runc) with the operator installed from its chart",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	pf := root.PersistentFlags()
	pf.StringVar(&o.dir, "dir", filepath.Join(".bashtask", "cluster"), "directory of the cluster's state, kubeconfig and logs")
	pf.StringVar(&o.binDir, "bin-dir", filepath.Join("bin", "k8s"), "directory of the Kubernetes binaries (hack/setup-envtest.sh --node)")
	up := &cobra.Command{
		Use:   "up",
		Short: "Build the images, start the node, install the chart and print the KUBECONFIG to use",
		Args:  cobra.NoArgs,
		RunE:  func(cmd *cobra.Command, _ []string) error { return runUp(cmd.Context(), o) },
	}
	f := up.Flags()
	f.StringVar(&o.imagesDir, "images-dir", filepath.Join("bin", "images"), "where the image archives (and the agent's cached root file system) go")
	f.StringVar(&o.tag, "tag", "dev", "tag of the images")
	f.BoolVar(&o.install, "install", true, "install the operator's chart")
	f.StringVar(&o.helm, "helm", filepath.Join("bin", "helm"), "helm binary")
	f.StringVar(&o.chart, "chart", filepath.Join("charts", "bashtask"), "the chart")
	f.StringVar(&o.values, "values", filepath.Join("hack", "cluster", "values.yaml"), "values file with the local images")
	f.StringVar(&o.release, "release", "bashtask", "release name")
	f.StringVar(&o.namespace, "namespace", "bashtask-system", "release namespace")
	down := &cobra.Command{
		Use:   "down",
		Short: "Stop every process of the cluster and undo what it changed on the host",
		Args:  cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			c, err := nodecluster.New(nodecluster.Options{Dir: o.dir, BinDir: o.binDir})
			if err != nil {
				return err
			}
			return c.Down()
		},
	}
	root.AddCommand(up, down)
	return root
}

func runUp(ctx context.Context, o *options) error {
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()
	begin := time.Now()
	// Refuse before building anything, and never take down a cluster this
	// run did not start.
	probe, err := nodecluster.New(nodecluster.Options{Dir: o.dir, BinDir: o.binDir})
	if err != nil {
		return err
	}
	if err := probe.CheckNotUp(); err != nil {
		return err
	}
	only := append(append(nodeimages.Kinds(), nodeimages.Registry), nodeimages.TaskKinds()...)
	images, err := nodeimages.Build(ctx, nodeimages.Options{RepoRoot: ".", OutDir: o.imagesDir, Tag: o.tag, Log: os.Stderr, Only: only})
	if err != nil {
		return err
	}
	opts := nodecluster.Options{Dir: o.dir, BinDir: o.binDir}
	built := map[nodeimages.Kind]nodeimages.Image{}
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
	c, err := nodecluster.New(opts)
	if err != nil {
		return err
	}
	fail := func(err error) error {
		if errors.Is(err, nodecluster.ErrAlreadyUp) {
			return err
		}
		fmt.Fprintf(os.Stderr, "cluster: %v\n", err)
		c.Diagnose(context.WithoutCancel(ctx), os.Stderr)
		c.WriteLogTails(os.Stderr, 30)
		fmt.Fprintln(os.Stderr, "cluster: taking the cluster down")
		return errors.Join(err, c.Down())
	}
	if err := c.Up(ctx); err != nil {
		return fail(err)
	}
	imageArgs, refs, err := startRegistry(ctx, c, built, o.tag)
	if err != nil {
		return fail(err)
	}
	if o.install {
		r := nodecluster.Release{
			Name: o.release, Namespace: o.namespace, Chart: o.chart, Helm: o.helm,
			Args: append([]string{"-f", o.values, "--set", "controller.image.tag=" + o.tag, "--set", "agent.image.tag=" + o.tag}, imageArgs...),
		}
		if err := c.Install(ctx, r); err != nil {
			return fail(err)
		}
	}
	if !o.install {
		fmt.Printf("\nThe operator is not installed; install it as docs/install.md says, with the images of this run:\n\n"+
			"  helm install %s %s --namespace %s -f %s --set controller.image.tag=%s --set agent.image.tag=%s %s\n",
			o.release, o.chart, o.namespace, o.values, o.tag, o.tag, strings.Join(imageArgs, " "))
	}
	fmt.Printf("\nThe in-cluster registry serves, for spec.image:\n\n")
	for _, r := range refs {
		fmt.Printf("  %s\n", r)
	}
	fmt.Printf("\nThe one-node cluster is up in %.0fs (logs in %s/logs; stop it with make cluster-down).\n\n  export KUBECONFIG=%s\n  export PATH=%s:%s:$PATH\n\n",
		time.Since(begin).Seconds(), absPath(o.dir), absPath(c.Kubeconfig()), absPath("bin"), absPath(o.binDir))
	return nil
}

func absPath(p string) string {
	if a, err := filepath.Abs(p); err == nil {
		return a
	}
	return p
}

// startRegistry starts the in-cluster registry, pushes the task images of
// built to it (HOST/bashtask/task-small:TAG and HOST/bashtask/bashtask-task:TAG)
// and returns the helm arguments that make the latter the agent's default
// image, and the references pushed.
func startRegistry(ctx context.Context, c *nodecluster.Cluster, built map[nodeimages.Kind]nodeimages.Image, tag string) ([]string, []string, error) {
	host, err := c.RegistryHost()
	if err != nil {
		return nil, nil, err
	}
	if err := c.StartRegistry(ctx, built[nodeimages.Registry].Ref); err != nil {
		return nil, nil, err
	}
	var refs []string
	for _, p := range []struct {
		kind nodeimages.Kind
		repo string
	}{{nodeimages.TaskSmall, "bashtask/task-small"}, {nodeimages.Task, "bashtask/bashtask-task"}} {
		img := built[p.kind]
		if _, err := c.PushToRegistry(ctx, img.Archive, img.Ref, p.repo, tag, nil); err != nil {
			return nil, nil, err
		}
		refs = append(refs, host+"/"+p.repo+":"+tag)
	}
	args := []string{
		"--set", "agent.images.defaultImage.repository=" + host + "/bashtask/bashtask-task",
		"--set", "agent.images.defaultImage.tag=" + tag,
		"--set", "agent.images.insecureRegistries={" + host + "}",
	}
	return args, refs, nil
}
