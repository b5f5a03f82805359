// Command bashtask-local runs a whole BashTask system on one machine: etcd
// and kube-apiserver, the CRDs, the controller and several agents on
// loopback addresses with generated certificates, and an object store. It
// is what `make demo` and the end-to-end tests run on.
package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/bashtask/bashtask-operator/internal/rig/localcluster"
	"github.com/bashtask/bashtask-operator/internal/rig/nodeimages"
	"github.com/bashtask/bashtask-operator/internal/rig/registry"
)

func main() {
	if err := newRootCommand().Execute(); err != nil {
		fmt.Fprintln(os.Stderr, "bashtask-local:", err)
		os.Exit(1)
	}
}

func newRootCommand() *cobra.Command {
	root := &cobra.Command{
		Use:           "bashtask-local",
		Short:         "Run a local BashTask cluster: control plane, controller and agents",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.AddCommand(newUpCommand(), newDownCommand())
	return root
}

func newUpCommand() *cobra.Command {
	o := localcluster.LauncherOptions{}
	var ro registryOptions
	cmd := &cobra.Command{
		Use:   "up",
		Short: "Start a local cluster and run it until interrupted",
		Long: `Start etcd and kube-apiserver (from bin/k8s, built by hack/setup-envtest.sh),
install the BashTask CRD, create the agents' Service, EndpointSlice and Nodes,
start --agents agents on 127.0.0.2, 127.0.0.3, ... and the controller, with
certificates generated for this run, and write an administrator's kubeconfig
to <dir>/kubeconfig. Logs of every component go to <dir>/logs/.

Runs until SIGINT or SIGTERM (Ctrl-C, or 'bashtask-local down'), then stops
everything it started. Only one cluster runs per directory.

With --registry it first builds the task images (--registry-image), starts
an image registry on the loopback (--registry-addr) with its blobs in
<dir>/registry, pushes the images there as HOST:PORT/bashtask/NAME:local and
prints their references, for a task's or a workspace's spec.image.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return up(cmd, o, ro) },
	}
	f := cmd.Flags()
	f.StringVar(&o.Dir, "dir", ".bashtask", "directory of the kubeconfig, certificates, logs and agent state")
	f.StringVar(&o.BinDir, "bin-dir", "bin", "directory holding bashtask-controller, bashtask-agent and versitygw")
	f.StringVar(&o.AssetsDir, "assets-dir", envOr("KUBEBUILDER_ASSETS", filepath.Join("bin", "k8s")), "directory holding kube-apiserver, etcd and kubectl; $KUBEBUILDER_ASSETS when set")
	f.StringVar(&o.CRDDir, "crd-dir", filepath.Join("config", "crd", "bases"), "directory of the CRD manifests")
	f.StringVar(&o.AdmissionDir, "admission-dir", filepath.Join("config", "admission"), "directory of the admission policies to install; empty installs none")
	f.IntVar(&o.Agents, "agents", 2, "number of agents, each with a node of its own")
	f.BoolVar(&o.S3, "s3", false, "store output in a local S3 server (versitygw, built by hack/setup-s3.sh) instead of a file:// bucket")
	f.StringArrayVar(&o.AgentEnv, "agent-env", nil, "NAME=VALUE added to the agents' own environment (repeatable); it reaches tasks as the agents' --ambient-env mode allows (at the tenant level only names --agent-arg=--ambient-allow=NAME lists)")
	f.StringVar(&o.Isolation, "isolation", "", "the agents' isolation level: tenant (a UID, namespaces, Landlock and seccomp per task; needs root) or process; empty means tenant when run as root, else process")
	f.StringArrayVar(&o.AgentArgs, "agent-arg", nil, "extra flag for every bashtask-agent (repeatable), such as --agent-arg=--task-network=none")
	f.StringArrayVar(&o.ControllerArgs, "controller-arg", nil, "extra flag for bashtask-controller (repeatable), such as --controller-arg=--max-running-per-owner=2")
	f.BoolVar(&ro.on, "registry", false, "start an image registry on the loopback and push the task images to it (docs/images.md)")
	f.StringVar(&ro.addr, "registry-addr", registry.DefaultAddr, "loopback address of the registry; port 0 picks a free one")
	f.StringSliceVar(&ro.images, "registry-image", []string{string(nodeimages.TaskSmall)}, "task images to build and push: task-small (seconds), task (Debian; minutes and root the first time, then cached in <bin-dir>/images/cache)")
	return cmd
}

func up(cmd *cobra.Command, o localcluster.LauncherOptions, ro registryOptions) error {
	o.Log = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	start := time.Now()
	var pushed []pushedImage
	if ro.on {
		reg, images, err := startRegistry(ctx, ro, o.Dir, o.BinDir, cmd.ErrOrStderr())
		if err != nil {
			return err
		}
		defer reg.Close()
		pushed = images
		o.AgentArgs = append(registryAgentArgs(ctx, o.BinDir, reg.Host()), o.AgentArgs...)
	}
	c, err := localcluster.Up(ctx, o)
	if err != nil {
		return err
	}
	// Close rather than Down: an undo that failed (a mount left behind, a
	// process that needed SIGKILL) is worth a line naming its step.
	defer func() {
		if err := c.Close(); err != nil {
			fmt.Fprintln(cmd.ErrOrStderr(), "bashtask-local: stopping:", err)
		}
	}()
	out := cmd.OutOrStdout()
	fmt.Fprintf(out, "\nbashtask-local is up in %s with %d agents at isolation %s; objects go to %s\n\n", time.Since(start).Round(100*time.Millisecond), len(c.Agents), c.Isolation, c.BucketURL)
	fmt.Fprintf(out, "  export KUBECONFIG=%s\n", abs(c.Kubeconfig))
	fmt.Fprintf(out, "  export PATH=%s:%s:$PATH   # kubectl and kubectl-bashtask\n", abs(o.BinDir), abs(o.AssetsDir))
	for _, e := range c.S3Env {
		fmt.Fprintf(out, "  export %s\n", e)
	}
	for _, p := range pushed {
		fmt.Fprintf(out, "  # image %s (%s)\n", p.ref, p.digest)
	}
	fmt.Fprintf(out, "  kubectl apply -f examples/hello.yaml\n")
	fmt.Fprintf(out, "  kubectl get bt\n")
	fmt.Fprintf(out, "  kubectl bashtask run -- uname -a\n\n")
	fmt.Fprintf(out, "Logs are in %s. Stop with Ctrl-C or 'bashtask-local down'.\n", filepath.Join(o.Dir, "logs"))
	fmt.Fprintf(out, "Every process started and host setting chosen is listed in %s.\n", filepath.Join(o.Dir, "changes.log"))
	<-ctx.Done()
	fmt.Fprintln(out, "\nbashtask-local: stopping")
	return nil
}

func newDownCommand() *cobra.Command {
	var dir string
	var timeout time.Duration
	cmd := &cobra.Command{
		Use:   "down",
		Short: "Stop the local cluster running in --dir and wait until it is gone",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			pid, err := localcluster.Signal(dir, syscall.SIGTERM)
			if err != nil {
				return err
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), timeout)
			defer cancel()
			for syscall.Kill(pid, 0) == nil {
				select {
				case <-ctx.Done():
					return errors.New("the launcher did not stop in time")
				case <-time.After(100 * time.Millisecond):
				}
			}
			fmt.Fprintf(cmd.OutOrStdout(), "bashtask-local (pid %d) stopped\n", pid)
			return nil
		},
	}
	cmd.Flags().StringVar(&dir, "dir", ".bashtask", "directory of the running cluster")
	cmd.Flags().DurationVar(&timeout, "timeout", 2*time.Minute, "how long to wait for the cluster to stop")
	return cmd
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

func abs(p string) string {
	if a, err := filepath.Abs(p); err == nil {
		return a
	}
	return p
}
