package plugin

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/term"
	"k8s.io/client-go/tools/remotecommand"

	btclient "github.com/bashtask/bashtask-operator/client"
)

// A terminal of a task (spec.tty; docs/kubectl-plugin.md, "A terminal"):
// attach, run -t and shell connect the local terminal to it through the
// output API's bashtasks/attach. The local terminal is put in raw mode,
// so that every key (^C, ^Z, the arrows) reaches the task's programs and
// the remote line discipline does the echo; its size goes along and
// follows every resize (SIGWINCH).

func (a *app) attachCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "attach TASK",
		Short: "Attach the local terminal to the terminal of a running task (created with run -t or shell)",
		Long: `attach connects the local terminal to the terminal of a running BashTask made
with spec.tty (run -t, shell): the recent screen shows first, then the
terminal's output as it comes; what you type goes to the task, ^C and ^Z
included, and the window size follows the local one. It exits with the
task's exit code when the task ends. Closing the local terminal, or
killing the plugin, detaches: the task runs on, and attach carries on
later. It takes get and create on bashtasks/attach in the API group
output.bashtask.dev.`,
		Example: `  kubectl bashtask attach mytask-x7k2p`,
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			_, oc, ns, err := a.clients()
			if err != nil {
				return err
			}
			return a.attachTerminal(cmd.Context(), oc, ns, args[0])
		},
	}
}

// attachTerminal attaches the local terminal to task ns/name until the
// task ends (its exit code is the plugin's) or an interrupt (SIGTERM, or
// SIGINT where the local stdin is no terminal) detaches.
func (a *app) attachTerminal(ctx context.Context, oc *btclient.Client, ns, name string) error {
	ctx, stop := a.cancelOnInterrupt(ctx)
	defer stop()
	in, out := a.opts.IOStreams.In, a.opts.IOStreams.Out
	if fd, ok := terminalFD(in); ok {
		old, err := term.MakeRaw(fd)
		if err != nil {
			return fmt.Errorf("putting the local terminal in raw mode: %w", err)
		}
		defer func() { _ = term.Restore(fd, old) }()
	}
	var sizes remotecommand.TerminalSizeQueue
	if fd, ok := terminalFD(out); ok {
		sizes = watchSize(ctx, fd)
	}
	err := oc.Attach(ctx, ns, name, btclient.AttachOptions{Stdin: in, Stdout: out, Sizes: sizes})
	var ee *btclient.AttachExitError
	switch {
	case err == nil:
		return nil
	case errors.As(err, &ee):
		return &exitError{code: ee.Code}
	case errors.Is(err, context.Canceled):
		a.note("detached from task %s/%s; it runs on (kubectl bashtask attach -n %s %s)", ns, name, ns, name)
		return nil
	}
	return &exitError{code: ExitPluginError, err: err}
}

// terminalFD is f's descriptor when f is a terminal.
func terminalFD(f any) (int, bool) {
	file, ok := f.(*os.File)
	if !ok || !term.IsTerminal(int(file.Fd())) {
		return 0, false
	}
	return int(file.Fd()), true
}

// sizeQueue delivers the local terminal's size: first the current one,
// then one per change, until its context ends.
type sizeQueue struct {
	sizes chan remotecommand.TerminalSize
}

// Next implements remotecommand.TerminalSizeQueue.
func (q *sizeQueue) Next() *remotecommand.TerminalSize {
	s, ok := <-q.sizes
	if !ok {
		return nil
	}
	return &s
}

// localSize reads fd's window size.
func localSize(fd int) (remotecommand.TerminalSize, bool) {
	w, h, err := term.GetSize(fd)
	if err != nil || w <= 0 || h <= 0 {
		return remotecommand.TerminalSize{}, false
	}
	return remotecommand.TerminalSize{Width: uint16(w), Height: uint16(h)}, true
}

// terminalShellTimeout is the time limit of shell's terminal task unless
// --timeout sets one: the controller's default --max-timeout-seconds.
const terminalShellTimeout = 600 * time.Second

// terminalShell runs an interactive bash with a terminal in workspace
// name and attaches the local terminal to it (shell without --line-mode).
func (a *app) terminalShell(ctx context.Context, name string, f shellFlags, timeoutSet bool) error {
	if !timeoutSet {
		f.timeout = terminalShellTimeout
	}
	rf := runFlags{tty: true, workspace: name, ttl: f.ttl, timeout: f.timeout}
	return a.run(ctx, rf, true, []string{"exec bash -il"}, false)
}
