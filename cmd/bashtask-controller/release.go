package main

import (
	"fmt"
	"os"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/runtime"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	bashtaskv1alpha1 "github.com/bashtask/bashtask-operator/api/v1alpha1"
	"github.com/bashtask/bashtask-operator/controllers"
)

// newReleaseTasksCommand is `bashtask-controller release-tasks`, the
// chart's pre-delete hook (controllers.ReleaseTasks).
func newReleaseTasksCommand() *cobra.Command {
	var timeout time.Duration
	cmd := &cobra.Command{
		Use:   "release-tasks",
		Short: "Before the operator is removed: cancel running tasks, wait for them, and remove the controller's finalizer from every BashTask",
		Long: `Run while the controller and the agents still run, before they are removed
(the Helm chart runs it as a pre-delete hook of helm uninstall). Running tasks
are cancelled and end Cancelled with their output; then the controller's
finalizer is removed from every BashTask, so none is left that cannot be
deleted once no controller runs. Tasks that were never dispatched stay
Pending and run after a new install.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			scheme := runtime.NewScheme()
			if err := bashtaskv1alpha1.AddToScheme(scheme); err != nil {
				return err
			}
			cfg, err := ctrl.GetConfig()
			if err != nil {
				return fmt.Errorf("loading the kubeconfig: %w", err)
			}
			c, err := client.New(cfg, client.Options{Scheme: scheme})
			if err != nil {
				return err
			}
			return controllers.ReleaseTasks(cmd.Context(), c, controllers.ReleaseOptions{
				Timeout: timeout,
				Logf:    func(format string, args ...any) { fmt.Fprintf(os.Stderr, "release-tasks: "+format+"\n", args...) },
			})
		},
	}
	cmd.Flags().DurationVar(&timeout, "timeout", 2*time.Minute, "how long to wait for the cancelled tasks to end")
	return cmd
}
