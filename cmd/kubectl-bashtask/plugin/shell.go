package plugin

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"time"

	"github.com/spf13/cobra"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	bashtaskv1alpha1 "github.com/bashtask/bashtask-operator/api/v1alpha1"
	btclient "github.com/bashtask/bashtask-operator/client"
)

// shellCarryWait bounds how long shell waits, after a task ended, for the
// workspace's status to show that task's carried directory for the next
// prompt. Past it the prompt shows the directory last seen.
const shellCarryWait = 5 * time.Second

type shellFlags struct {
	timeout  time.Duration
	ttl      time.Duration
	lineMode bool // --line-mode: each line a task, no terminal
}

func (a *app) shellCommand() *cobra.Command {
	var f shellFlags
	cmd := &cobra.Command{
		Use:   "shell WORKSPACE",
		Short: "A terminal in a workspace: an interactive bash of its own, or with --line-mode a task per line",
		Long: `shell opens a terminal in the workspace: one BashTask with spec.tty runs an
interactive bash ("bash -il") there, and the local terminal is attached to
it as "run -t" does (raw mode, window size, ^C to the remote program; the
shell's exit code is the plugin's). It takes get and create on
bashtasks/attach in output.bashtask.dev. The task's time limit is --timeout
(default 600s, the controller's default --max-timeout-seconds). Killing the
plugin detaches: "kubectl bashtask attach TASK" carries on. What the
interactive shell changes (its directory, its variables) is not carried to
the workspace's next tasks.

With --line-mode, shell reads command lines and runs each as a BashTask in the workspace,
as "run --workspace" does: the output arrives as it is written, a non-zero
exit code is shown after it, and the prompt shows the directory the next
line starts in (the workspace's carried directory; ~ is its root). Each line
is its own bash -c, so what carries from one line to the next is what the
workspace carries: the working directory, and the exported variables with
carryOver.environment. Ctrl-C cancels the running line; Ctrl-D, "exit" or
"logout" leaves the shell (the workspace stays). Lines run with the
workspace's owner.`,
		Example: `  # A terminal in workspace s1
  kubectl bashtask shell s1

  # A prompt whose lines run as tasks, with no terminal
  kubectl bashtask shell --line-mode s1`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if !f.lineMode {
				return a.terminalShell(cmd.Context(), args[0], f, cmd.Flags().Changed("timeout"))
			}
			return a.shell(cmd.Context(), args[0], f)
		},
	}
	cmd.Flags().BoolVar(&f.lineMode, "line-mode", false, "run each line as a task of its own, without a terminal, the working directory and exports carried from line to line")
	cmd.Flags().DurationVar(&f.timeout, "timeout", 0, "spec.timeoutSeconds of each line (whole seconds; default the API's 120s; "+
		"at most the controller's --max-timeout-seconds, 600s unless its administrator changed it)")
	cmd.Flags().DurationVar(&f.ttl, "ttl", time.Hour, "delete each line's task this long after it ended (spec.ttlSecondsAfterFinished); 0 leaves the controller's default TTL, an hour unless configured")
	return cmd
}

// shellSession is one shell's state.
type shellSession struct {
	a    *app
	c    client.Client
	bc   *btclient.Client
	ns   string
	ws   *bashtaskv1alpha1.BashWorkspace
	f    shellFlags
	last int // exit status of the last line
}

func (a *app) shell(ctx context.Context, name string, f shellFlags) error {
	if f.timeout != 0 && (f.timeout%time.Second != 0 || f.timeout < time.Second || f.timeout > maxTimeoutSeconds*time.Second) {
		return &exitError{code: ExitPluginError, err: fmt.Errorf("--timeout %s: whole seconds from 1s to %ds", f.timeout, maxTimeoutSeconds)}
	}
	if _, err := ttlSeconds(f.ttl); err != nil {
		return &exitError{code: ExitPluginError, err: err}
	}
	c, ns, err := a.client()
	if err != nil {
		return err
	}
	cfg, err := a.flags.ToRESTConfig()
	if err != nil {
		return fmt.Errorf("loading the kubeconfig: %w", err)
	}
	bc, err := btclient.New(cfg)
	if err != nil {
		return err
	}
	ws := &bashtaskv1alpha1.BashWorkspace{}
	ws.Namespace, ws.Name = ns, name
	if err := c.Get(ctx, client.ObjectKeyFromObject(ws), ws); err != nil {
		return fmt.Errorf("reading workspace %s/%s: %w", ns, name, err)
	}
	if ws, err = waitWorkspace(ctx, bc, ws, time.Minute); err != nil {
		return err
	}
	s := &shellSession{a: a, c: c, bc: bc, ns: ns, ws: ws, f: f}
	return s.loop(ctx)
}

// promptDir shows the directory the next line starts in, with the
// workspace's root (the tasks' HOME) as ~.
func promptDir(ws *bashtaskv1alpha1.BashWorkspace) string {
	dir := ptr.Deref(ws.Status.WorkingDir, bashtaskv1alpha1.WorkspacePath)
	root := ptr.Deref(ws.Status.Path, bashtaskv1alpha1.WorkspacePath)
	if rest, ok := strings.CutPrefix(dir, root); ok && (rest == "" || rest[0] == '/') {
		return "~" + rest
	}
	return dir
}

// loop reads lines until EOF or exit, running each one. Lines are read by
// a goroutine of their own, so that an interrupt at the prompt and one
// while a line runs are both seen.
func (s *shellSession) loop(ctx context.Context) error {
	lines := make(chan string)
	readErr := make(chan error, 1)
	go func() {
		r := bufio.NewReader(s.a.opts.IOStreams.In)
		for {
			line, err := r.ReadString('\n')
			if line != "" || err == nil {
				select {
				case lines <- line:
				case <-ctx.Done():
					return
				}
			}
			if err != nil {
				readErr <- err
				return
			}
		}
	}()
	out := s.a.opts.IOStreams.ErrOut
	for {
		fmt.Fprintf(out, "%s:%s$ ", s.ws.Name, promptDir(s.ws))
		var line string
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-s.a.opts.Interrupts:
			fmt.Fprintln(out) // as bash does: a fresh prompt
			continue
		case err := <-readErr:
			fmt.Fprintln(out)
			if errors.Is(err, io.EOF) {
				return s.exit()
			}
			return fmt.Errorf("reading the command line: %w", err)
		case line = <-lines:
		}
		cmd := strings.TrimSpace(line)
		switch cmd {
		case "":
			continue
		case "exit", "logout":
			return s.exit()
		}
		if err := s.runLine(ctx, cmd); err != nil {
			return err
		}
	}
}

// exit ends the shell with the last line's status, as bash's exit does.
func (s *shellSession) exit() error {
	if s.last == 0 {
		return nil
	}
	return &exitError{code: s.last}
}

// runLine runs one line as a task and shows its output and end.
func (s *shellSession) runLine(ctx context.Context, cmd string) error {
	if len(cmd) > bashtaskv1alpha1.MaxCommandBytes {
		s.a.note("the line is %d bytes, over the limit of %d (spec.command)", len(cmd), bashtaskv1alpha1.MaxCommandBytes)
		s.last = ExitPluginError
		return nil
	}
	bt := &bashtaskv1alpha1.BashTask{
		ObjectMeta: metav1.ObjectMeta{Namespace: s.ns, GenerateName: s.ws.Name + "-"},
		Spec: bashtaskv1alpha1.BashTaskSpec{
			Command:   cmd,
			Workspace: ptr.To(s.ws.Name),
			Owner:     s.ws.Spec.Owner,
		},
	}
	if s.f.timeout > 0 {
		bt.Spec.TimeoutSeconds = ptr.To(int32(s.f.timeout / time.Second))
	}
	bt.Spec.TTLSecondsAfterFinished, _ = ttlSeconds(s.f.ttl) // checked in shell
	if err := s.c.Create(ctx, bt); err != nil {
		s.a.note("creating the task: %v", err)
		s.last = ExitPluginError
		return nil
	}
	runCtx, stopFollow := context.WithCancel(ctx)
	defer stopFollow()
	var wg sync.WaitGroup
	var mu sync.Mutex
	var followErrs []error
	for _, stream := range []struct {
		name string
		w    io.Writer
	}{{"stdout", s.a.opts.IOStreams.Out}, {"stderr", s.a.opts.IOStreams.ErrOut}} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := s.follow(runCtx, bt, stream.name, stream.w); err != nil {
				mu.Lock()
				followErrs = append(followErrs, err)
				mu.Unlock()
			}
		}()
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	cancelled := false
	for waiting := true; waiting; {
		select {
		case <-done:
			waiting = false
		case <-ctx.Done():
			return ctx.Err()
		case <-s.a.opts.Interrupts:
			if cancelled {
				// A second Ctrl-C stops waiting; the task still ends.
				stopFollow()
				<-done
				waiting = false
				continue
			}
			cancelled = true
			if err := s.bc.Cancel(ctx, bt.Namespace, bt.Name, bt.UID); err != nil {
				s.a.note("cancelling %s: %v", bt.Name, err)
			}
		}
	}
	for _, err := range followErrs {
		s.a.note("%v", err)
	}
	final, err := s.ended(ctx, bt)
	if err != nil {
		s.a.note("%v", err)
		s.last = ExitPluginError
		return nil
	}
	s.last = shellStatus(s.a, final)
	s.refreshWorkspace(ctx, final)
	return nil
}

// follow copies one stream of bt to w as it arrives.
func (s *shellSession) follow(ctx context.Context, bt *bashtaskv1alpha1.BashTask, stream string, w io.Writer) error {
	r, err := s.bc.FollowLog(ctx, bt.Namespace, bt.Name, btclient.LogOptions{Stream: stream, Follow: true})
	if err != nil {
		return fmt.Errorf("%s of %s: %w", stream, bt.Name, err)
	}
	defer r.Close()
	if _, err := io.Copy(w, r); err != nil && ctx.Err() == nil {
		return fmt.Errorf("%s of %s from offset %d: %w", stream, bt.Name, r.Offset(), err)
	}
	return nil
}

// ended waits, on a watch of bt from its create, until it has its
// terminal reason: a followed stream ends with the task, the status
// write may come a moment later.
func (s *shellSession) ended(ctx context.Context, bt *bashtaskv1alpha1.BashTask) (*bashtaskv1alpha1.BashTask, error) {
	wctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	res, err := s.bc.Wait(wctx, bt, btclient.RunOptions{})
	if err != nil {
		return nil, fmt.Errorf("waiting for the end of %s: %w", bt.Name, err)
	}
	return res.Task, nil
}

// shellStatus shows how a line ended, when it did not succeed, and
// returns its exit status as bash's $? would be.
func shellStatus(a *app, bt *bashtaskv1alpha1.BashTask) int {
	reason := ptr.Deref(bt.Status.Reason, "")
	code := int(ptr.Deref(bt.Status.ExitCode, -1))
	switch {
	case reason == bashtaskv1alpha1.ReasonSucceeded:
		return 0
	case reason == bashtaskv1alpha1.ReasonNonZeroExit:
		a.note("exit %d", code)
		return code
	case code > 0:
		a.note("exit %d (%s: %s)", code, reason, ptr.Deref(bt.Status.Message, ""))
		return code
	default:
		a.note("%s: %s", reason, ptr.Deref(bt.Status.Message, ""))
		return ExitFailure
	}
}

// refreshWorkspace reads the workspace until its status reflects bt's end
// (status.lastTask names bt or a later task), so that the next prompt
// shows the directory bt ended in; after shellCarryWait it keeps what it
// read.
func (s *shellSession) refreshWorkspace(ctx context.Context, bt *bashtaskv1alpha1.BashTask) {
	var got bashtaskv1alpha1.BashWorkspace
	_ = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, shellCarryWait, true, func(ctx context.Context) (bool, error) {
		if err := s.c.Get(ctx, client.ObjectKeyFromObject(s.ws), &got); err != nil {
			return false, nil //nolint:nilerr // a failed read is retried until the wait ends
		}
		s.ws = got.DeepCopy()
		return ptr.Deref(got.Status.LastTask, "") == bt.Name ||
			(got.Status.LastTaskTime != nil && bt.Status.CompletionTime != nil && got.Status.LastTaskTime.After(bt.Status.CompletionTime.Time)), nil
	})
	if msg := ptr.Deref(s.ws.Status.CarryMessage, ""); msg != "" && ptr.Deref(s.ws.Status.LastTask, "") == bt.Name {
		s.a.note("%s", msg)
	}
}
