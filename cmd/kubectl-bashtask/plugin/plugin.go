// Package plugin implements kubectl-bashtask, the kubectl plugin for
// BashTask resources: run, logs, cancel, wait and get. The command tree lives
// here rather than in package main so that tests can run it in-process
// against a real API server, with their own streams and interrupts.
package plugin

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"time"

	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	"k8s.io/cli-runtime/pkg/genericiooptions"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	bashtaskv1alpha1 "github.com/bashtask/bashtask-operator/api/v1alpha1"
	btclient "github.com/bashtask/bashtask-operator/client"
)

// Exit statuses of kubectl-bashtask. run and wait pass the task's own exit
// code through, so the plugin's own outcomes use codes a shell command
// rarely chooses, as `docker run` and timeout(1) do.
const (
	// ExitOK: the task succeeded, or get, logs or cancel did their work.
	ExitOK = 0
	// ExitFailure: the task ended without a non-zero exit code to pass on
	// (StartFailed, AgentLost, ...), with a message on stderr; or get, logs
	// or cancel failed.
	ExitFailure = 1
	// ExitWaitTimeout: wait --timeout, or run --wait-timeout, passed
	// before the task ended; run cancels the task then, wait leaves it.
	ExitWaitTimeout = 124
	// ExitPluginError: run or wait could not do their work: invalid
	// arguments, an input over an API limit, an unreachable or refusing API
	// server, a task deleted while it was followed, or (run) a stream that
	// could not be written whole.
	ExitPluginError = 125
	// ExitInterrupted: run was interrupted a second time and stopped
	// waiting for the cancelled task to end.
	ExitInterrupted = 130
)

// exitStatusHelp documents the exit statuses in the root command's help.
const exitStatusHelp = `Exit status of run and wait:
  0        the task succeeded (run --detach: the task was created)
  1-255    the task's exit code when it is non-zero, whatever the reason (128+n when
           signal n killed it: 143 for a task cancelled or timed out by SIGTERM);
           a message on stderr names any reason other than NonZeroExit
  1        the task ended without a non-zero exit code (StartFailed, AgentLost,
           InvalidSpec, ...); a message on stderr names the reason
  124      wait --timeout, or run --wait-timeout, passed before the task ended
           (run cancels the task; wait leaves it running)
  125      the plugin failed: invalid arguments, an input over an API limit,
           an API error, a --workspace that does not exist or is held, the
           task was deleted while followed, or run could not write a stream
           whole (without --tail-ok)
  130      run was interrupted twice and stopped waiting
Exit status of get, logs and cancel: 0 on success, 1 on any error.`

// Options are the process-level dependencies of the command tree.
type Options struct {
	// IOStreams are the local standard streams.
	IOStreams genericiooptions.IOStreams
	// Interrupts delivers the user's Ctrl-C. run answers the first by
	// requesting cancellation of its task and keeps waiting for the end;
	// the second makes it stop waiting. The other commands stop at the
	// first. Nil: never interrupted.
	Interrupts <-chan os.Signal
	// Now is the clock for ages and durations; nil means time.Now.
	Now func() time.Time
}

// exitError carries an exit status out of a command. A nil err means the
// command already said everything it had to say.
type exitError struct {
	code int
	err  error
}

func (e *exitError) Error() string {
	if e.err == nil {
		return fmt.Sprintf("exit status %d", e.code)
	}
	return e.err.Error()
}

func (e *exitError) Unwrap() error { return e.err }

// app is the state the subcommands share.
type app struct {
	opts  Options
	flags *genericclioptions.ConfigFlags
	// errOut is the local stderr, shared by the plugin's notes, API
	// warnings and a task's stderr, which run copies while the plugin
	// may note something else.
	errOut io.Writer
}

// lockedWriter serializes the writes of several goroutines to one writer.
type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// Main runs the command tree with args (without the program name) and
// returns the process exit status.
func Main(ctx context.Context, opts Options, args []string) int {
	if opts.Now == nil {
		opts.Now = time.Now
	}
	a := &app{opts: opts, flags: genericclioptions.NewConfigFlags(true), errOut: &lockedWriter{w: opts.IOStreams.ErrOut}}
	root := a.rootCommand()
	root.SetArgs(args)
	root.SetIn(opts.IOStreams.In)
	root.SetOut(opts.IOStreams.Out)
	root.SetErr(a.errOut)
	cmd, err := root.ExecuteContextC(ctx)
	if err == nil {
		return ExitOK
	}
	var ee *exitError
	if errors.As(err, &ee) {
		if ee.err != nil {
			fmt.Fprintln(opts.IOStreams.ErrOut, "kubectl-bashtask:", ee.err)
		}
		return ee.code
	}
	if meta.IsNoMatchError(err) {
		err = fmt.Errorf("%w: the cluster does not serve bashtask.dev/v1alpha1; install the BashTask CRD (config/crd) first", err)
	}
	fmt.Fprintln(opts.IOStreams.ErrOut, "kubectl-bashtask:", err)
	if errors.Is(err, errTaskDeleted) {
		// One rule for run, wait and logs -f.
		return ExitPluginError
	}
	if cmd != nil && (cmd.Name() == "run" || cmd.Name() == "wait") {
		return ExitPluginError
	}
	return ExitFailure
}

func (a *app) rootCommand() *cobra.Command {
	root := &cobra.Command{
		Use:   "kubectl-bashtask",
		Short: "Run shell commands as BashTask resources and read their results",
		Long: `kubectl-bashtask runs shell commands on cluster nodes as BashTask resources
(bashtask.dev/v1alpha1) and reads their outcome and output. Installed on the
PATH, it is also "kubectl bashtask". The standard kubectl flags select the
cluster, user and namespace.

` + exitStatusHelp,
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	a.flags.AddFlags(root.PersistentFlags())
	root.AddCommand(a.runCommand(), a.logsCommand(), a.cancelCommand(), a.waitCommand(), a.getCommand(),
		a.workspaceCommand(), a.shellCommand(), a.cpCommand(), a.attachCommand(), a.portForwardCommand(), a.mcpCommand())
	return root
}

// scheme knows Secrets (for --env-from-secret), BashTasks and
// BashWorkspaces: the core group alone, not every built-in kind, whose
// registration would cost each command milliseconds of start-up
// (docs/performance.md).
var scheme = func() *runtime.Scheme {
	s := runtime.NewScheme()
	if err := corev1.AddToScheme(s); err != nil {
		panic(err)
	}
	if err := bashtaskv1alpha1.AddToScheme(s); err != nil {
		panic(err)
	}
	return s
}()

// restMapper maps the kinds the plugin uses (BashTask, BashWorkspace and
// Secret) without asking the API server: a discovery of the cluster's
// resources would cost every command round trips before its first call
// (docs/performance.md). A cluster without the CRD answers 404, which
// notServed explains.
func restMapper() meta.RESTMapper {
	m := btclient.RESTMapper()
	m.Add(corev1.SchemeGroupVersion.WithKind("Secret"), meta.RESTScopeNamespace)
	return m
}

// restConfig returns the user's REST configuration and the namespace that
// -n or the kubeconfig context selects.
func (a *app) restConfig() (*rest.Config, string, error) {
	cfg, err := a.flags.ToRESTConfig()
	if err != nil {
		return nil, "", fmt.Errorf("loading the kubeconfig: %w", err)
	}
	cfg = rest.CopyConfig(cfg)
	cfg.UserAgent = "kubectl-bashtask"
	// API warnings (deprecations, validation hints) go to the user, as
	// kubectl shows them.
	cfg.WarningHandler = rest.NewWarningWriter(a.errOut, rest.WarningWriterOptions{Deduplicate: true})
	ns, _, err := a.flags.ToRawKubeConfigLoader().Namespace()
	if err != nil {
		return nil, "", fmt.Errorf("finding the namespace: %w", err)
	}
	return cfg, ns, nil
}

// client returns an API client with the user's credentials and the
// namespace that -n or the kubeconfig context selects.
func (a *app) client() (client.WithWatch, string, error) {
	cfg, ns, err := a.restConfig()
	if err != nil {
		return nil, "", err
	}
	c, err := client.NewWithWatch(cfg, client.Options{Scheme: scheme, Mapper: restMapper()})
	if err != nil {
		return nil, "", fmt.Errorf("creating the API client: %w", err)
	}
	return c, ns, nil
}

// clients returns client's API client and a reader of task output
// through output.bashtask.dev, both with the user's credentials: reading
// output takes RBAC (get on bashtasks/log in that group), no bucket
// credentials.
func (a *app) clients() (client.WithWatch, *btclient.Client, string, error) {
	cfg, ns, err := a.restConfig()
	if err != nil {
		return nil, nil, "", err
	}
	c, err := client.NewWithWatch(cfg, client.Options{Scheme: scheme, Mapper: restMapper()})
	if err != nil {
		return nil, nil, "", fmt.Errorf("creating the API client: %w", err)
	}
	oc, err := btclient.New(cfg)
	if err != nil {
		return nil, nil, "", fmt.Errorf("creating the output client: %w", err)
	}
	return c, oc, ns, nil
}

// note writes one of the plugin's own messages to the local stderr, where
// the task's stderr goes too; the prefix tells them apart.
func (a *app) note(format string, args ...any) {
	fmt.Fprintf(a.errOut, "kubectl-bashtask: "+format+"\n", args...)
}

// cancelOnInterrupt returns a context that ends at the first interrupt,
// for the commands that do not own a task and simply stop; call stop when
// done.
func (a *app) cancelOnInterrupt(ctx context.Context) (context.Context, func()) {
	ctx, cancel := context.WithCancel(ctx)
	if a.opts.Interrupts == nil {
		return ctx, cancel
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		select {
		case <-a.opts.Interrupts:
			cancel()
		case <-ctx.Done():
		}
	}()
	return ctx, func() { cancel(); <-done }
}
