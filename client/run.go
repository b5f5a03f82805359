package client

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	bashtaskv1alpha1 "github.com/bashtask/bashtask-operator/api/v1alpha1"
)

// DefaultTTL is how long a task made by Run or Start is kept after it
// ended (spec.ttlSecondsAfterFinished) when RunOptions.TTL is zero: one
// hour, long enough to read its output again, short enough that a busy
// platform's tasks do not pile up (docs/client.md).
const DefaultTTL = time.Hour

// DefaultGenerateName is the prefix of a task's generated name when
// RunOptions has neither Name nor GenerateName.
const DefaultGenerateName = "run-"

// RunOptions describe the task Run and Start create and how Run waits for
// it. Every field is a plain value; the zero value of each is its
// default. docs/client.md has the rules.
type RunOptions struct {
	// Namespace of the task; empty means "default".
	Namespace string
	// Name of the task; empty means a generated name (GenerateName).
	Name string
	// GenerateName is the prefix of a generated name; empty means
	// DefaultGenerateName.
	GenerateName string
	// Command is spec.command, run with bash -c; required unless Task is
	// set.
	Command string
	// Workspace is spec.workspace: the BashWorkspace the task runs in.
	Workspace string
	// Owner is spec.owner. With a Workspace it must be the workspace's
	// spec.owner, if that is set: the controller refuses another owner,
	// or none, with InvalidSpec naming both. Run does not read the
	// workspace for it, which would cost each command a round trip and
	// get on bashworkspaces.
	Owner string
	// WorkingDir is spec.workingDir (relative to a workspace's root).
	WorkingDir string
	// NodeName is spec.nodeName (not with a Workspace).
	NodeName string
	// Image is spec.image, the OCI image the task runs in
	// ([registry/]repository[:tag][@digest], docs/images.md); empty runs
	// it in the agent's default image, or on the node's root. Not with a
	// Workspace: its tasks run in the workspace's image
	// (WorkspaceOptions.Image).
	Image string
	// ImagePullSecrets are spec.imagePullSecrets, the names of Secrets of
	// type kubernetes.io/dockerconfigjson in Namespace (at most 16); only
	// with Image.
	ImagePullSecrets []string
	// Env is spec.env, one entry per name, in the order of the names.
	Env map[string]string
	// Stdin, when set, is spec.stdin: at most 262144 bytes of UTF-8.
	Stdin *string
	// StdinStream, when set, gives the task a streamed standard input
	// (spec.stdinStream, any bytes, no size limit): Run sends what it
	// reads from it while the command runs, through bashtasks/stdin
	// (RBAC: create on it in output.bashtask.dev), and closes the task's
	// input at its EOF. Start ignores it. Run does not wait for a read of
	// it that blocks past the task's end.
	StdinStream io.Reader
	// TTY is spec.tty: the task gets a terminal, whose input and window
	// sizes Attach sends and whose screen is its stdout (docs/client.md,
	// "A terminal"). Not with Stdin or StdinStream.
	TTY bool
	// Timeout is spec.timeoutSeconds, the command's own time limit once
	// it runs, rounded up to whole seconds; zero means the API's default
	// (120 s). The controller refuses one over its --max-timeout-seconds
	// (600 s by default) with InvalidSpec.
	Timeout time.Duration
	// TTL is spec.ttlSecondsAfterFinished, rounded up to whole seconds:
	// how long the task is kept after it ended. Zero means DefaultTTL; a
	// negative TTL leaves the field unset: the controller's
	// --default-ttl-seconds-after-finished applies (an hour by default; a
	// negative value there keeps the task).
	TTL time.Duration
	// WaitTimeout bounds Run's whole wait, from the create to the task's
	// end, its time pending included (which Timeout does not count).
	// When it passes, Run cancels the task (spec.cancelRequested) and
	// returns a *WaitTimeoutError at once. Zero: no bound but ctx.
	WaitTimeout time.Duration
	// Stdout and Stderr receive the task's streams as the command writes
	// them; nil discards a stream without reading it.
	Stdout, Stderr io.Writer
	// Notes, when set, receives one line for each thing worth telling
	// the caller that is not the command's output: why the task is not
	// running yet (each new reason once, the first within 2 s of the
	// create), that the workspace was restored from a snapshot for it
	// (RestoreNote), and processes the command left behind.
	Notes io.Writer
	// Task, when set, is created as it is, and the fields above that
	// shape a task (Namespace to TTL) are ignored: for a spec they do not
	// cover. Run sets its Name, UID and ResourceVersion from the create.
	Task *bashtaskv1alpha1.BashTask
}

// Result is how a task of Run ended.
type Result struct {
	// Task is the task as last seen, with its terminal status.
	Task *bashtaskv1alpha1.BashTask
	// ExitCode is the command's exit code (128+n when signal n killed
	// it), or -1 when it has none (it never ran, or its end was not
	// observed).
	ExitCode int
	// Reason is status.reason, Message status.message.
	Reason  bashtaskv1alpha1.Reason
	Message string
	// StdoutBytes and StderrBytes are the bytes written to Stdout and
	// Stderr.
	StdoutBytes, StderrBytes int64
	// LeftoverProcesses is status.leftoverProcesses: processes of the
	// command still alive when its shell exited, which were stopped.
	LeftoverProcesses int
}

// ErrNoCommand is returned for RunOptions without a Command or a Task.
var ErrNoCommand = errors.New("spec.command: a command is required (RunOptions.Command)")

// Run creates a task from opts, writes its stdout and stderr to
// opts.Stdout and opts.Stderr as the command writes them, waits until it
// has ended, and returns how (RBAC: create, get and watch on bashtasks,
// get on bashtasks/log in output.bashtask.dev when a writer is set). The
// wait is one watch of the task from its create, never a poll: the
// result comes as soon as the controller wrote the terminal status, and
// a stream that the status tail holds whole is not read again.
//
// A task that ends is no error, whatever its exit code: see
// Result.ExitCode and Result.Reason. The errors are the create's (an
// *apierrors.StatusError), a *WaitTimeoutError when opts.WaitTimeout
// passed (the task is cancelled), ErrTaskDeleted when the task was deleted
// before it ended, an error naming a stream that could not be read or
// written whole (with the Result, when the task ended), and ctx's error:
// when ctx ends first the task keeps running.
func (c *Client) Run(ctx context.Context, opts RunOptions) (*Result, error) {
	start := time.Now()
	task, err := c.Start(ctx, opts)
	if err != nil {
		return nil, err
	}
	w := &runWait{c: c, task: task, notes: opts.Notes, start: start, bound: opts.WaitTimeout}
	if opts.StdinStream != nil && task.Spec.StdinStream != nil {
		sctx, stop := context.WithCancel(ctx)
		defer stop()
		go c.pumpStdin(sctx, task, opts.StdinStream, opts.Notes)
	}
	return w.run(ctx, opts.Stdout, opts.Stderr)
}

// Start creates a task from opts and returns it at once, detached: it
// runs on without a client (RBAC: create on bashtasks). Its output is read later
// by offset with FollowLog, its end with Wait; Cancel stops it. A
// long-lived service in a workspace is such a task, with a Timeout up to
// the controller's cap (docs/client.md).
func (c *Client) Start(ctx context.Context, opts RunOptions) (*bashtaskv1alpha1.BashTask, error) {
	task := opts.Task
	if task == nil {
		var err error
		if task, err = taskOf(opts); err != nil {
			return nil, err
		}
	}
	if err := c.k8s.Create(ctx, task); err != nil {
		return nil, fmt.Errorf("creating BashTask %s/%s: %w", task.Namespace, nameOrPrefix(task), err)
	}
	return task, nil
}

// Wait waits until task has ended, as Run does, and returns how it
// ended. task needs its namespace, name and UID, and a resourceVersion to
// watch from (the object Start returned, or any read of it).
// opts.Stdout and opts.Stderr, when set, get the task's output from its
// first byte as Run's do (both in the order the agent read them, also
// for a task that ended before the call); opts.Notes and
// opts.WaitTimeout apply, the bound counted from this call; the other
// fields are ignored.
func (c *Client) Wait(ctx context.Context, task *bashtaskv1alpha1.BashTask, opts RunOptions) (*Result, error) {
	w := &runWait{c: c, task: task, notes: opts.Notes, start: time.Now(), bound: opts.WaitTimeout}
	return w.run(ctx, opts.Stdout, opts.Stderr)
}

// nameOrPrefix names a task in a message before the API server named it.
func nameOrPrefix(t *bashtaskv1alpha1.BashTask) string {
	if t.Name != "" {
		return t.Name
	}
	return t.GenerateName + "*"
}

// taskOf builds the task of opts, checking what the API would refuse so
// that the error names the option.
func taskOf(opts RunOptions) (*bashtaskv1alpha1.BashTask, error) {
	if opts.Command == "" {
		return nil, ErrNoCommand
	}
	t := &bashtaskv1alpha1.BashTask{
		ObjectMeta: metav1.ObjectMeta{Namespace: opts.Namespace, Name: opts.Name},
		Spec: bashtaskv1alpha1.BashTaskSpec{
			Command:    opts.Command,
			Workspace:  optional(opts.Workspace),
			Owner:      optional(opts.Owner),
			WorkingDir: optional(opts.WorkingDir),
			NodeName:   optional(opts.NodeName),
			Stdin:      opts.Stdin,
		},
	}
	if t.Namespace == "" {
		t.Namespace = "default"
	}
	if t.Name == "" {
		t.GenerateName = cmp.Or(opts.GenerateName, DefaultGenerateName)
	}
	for _, k := range slices.Sorted(maps.Keys(opts.Env)) {
		t.Spec.Env = append(t.Spec.Env, bashtaskv1alpha1.EnvVar{Name: k, Value: ptr.To(opts.Env[k])})
	}
	if opts.TTY {
		t.Spec.TTY = ptr.To(true)
	}
	if opts.StdinStream != nil {
		t.Spec.StdinStream = &bashtaskv1alpha1.StdinStream{}
	}
	var err error
	if t.Spec.Image, t.Spec.ImagePullSecrets, err = imageOf("RunOptions", opts.Image, opts.ImagePullSecrets); err != nil {
		return nil, err
	}
	if opts.Workspace != "" && t.Spec.Image != nil {
		return nil, fmt.Errorf("RunOptions.Image %q: spec.image must be unset with spec.workspace (RunOptions.Workspace %q): the task runs in the workspace's image", opts.Image, opts.Workspace)
	}
	if t.Spec.TimeoutSeconds, err = seconds("RunOptions.Timeout", "spec.timeoutSeconds", opts.Timeout, 1, maxTimeoutSeconds); err != nil {
		return nil, err
	}
	ttl := opts.TTL
	if ttl == 0 {
		ttl = DefaultTTL
	}
	if t.Spec.TTLSecondsAfterFinished, err = seconds("RunOptions.TTL", "spec.ttlSecondsAfterFinished", ttl, 0, maxTTLSeconds); err != nil {
		return nil, err
	}
	return t, nil
}

// maxImagePullSecrets is spec.imagePullSecrets' schema limit.
const maxImagePullSecrets = 16

// imageOf is spec.image and spec.imagePullSecrets of an Image and its
// ImagePullSecrets option (of the options type typ): nil for none, and an
// error naming the option for pull secrets without an image or over the
// schema's 16.
func imageOf(typ, image string, secrets []string) (*bashtaskv1alpha1.ImageReference, []bashtaskv1alpha1.ImagePullSecret, error) {
	if len(secrets) > 0 && image == "" {
		return nil, nil, fmt.Errorf("%s.ImagePullSecrets: spec.imagePullSecrets needs spec.image (%s.Image)", typ, typ)
	}
	if len(secrets) > maxImagePullSecrets {
		return nil, nil, fmt.Errorf("%s.ImagePullSecrets: %d Secrets, over the limit of %d of spec.imagePullSecrets", typ, len(secrets), maxImagePullSecrets)
	}
	if image == "" {
		return nil, nil, nil
	}
	out := make([]bashtaskv1alpha1.ImagePullSecret, 0, len(secrets))
	for _, s := range secrets {
		out = append(out, bashtaskv1alpha1.ImagePullSecret{Name: s})
	}
	if len(out) == 0 {
		out = nil
	}
	return ptr.To(bashtaskv1alpha1.ImageReference(image)), out, nil
}

// Limits of spec fields Run sets from durations, as the schema has them.
const (
	maxTimeoutSeconds = 604800
	maxTTLSeconds     = 1<<31 - 1
)

// seconds converts a duration option (named as the caller writes it) to
// its field's whole seconds, rounding up: nil for zero, and for less
// where minimum is 0 (the field unset); else an error naming the option
// when it is out of [minimum, maximum].
func seconds(option, field string, d time.Duration, minimum, maximum int64) (*int32, error) {
	if d < 0 && minimum > 0 {
		return nil, fmt.Errorf("%s %s: %s must not be negative", option, d, field)
	}
	if d <= 0 {
		return nil, nil
	}
	s := int64((d + time.Second - 1) / time.Second)
	if s < minimum || s > maximum {
		return nil, fmt.Errorf("%s %s: %s is %d to %d seconds", option, d, field, minimum, maximum)
	}
	return ptr.To(int32(s)), nil
}

func optional(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

// stdinReadBytes is the most one read of RunOptions.StdinStream takes;
// each read is sent as it returns.
const stdinReadBytes = 256 << 10

// pumpStdin sends r to the task's streamed input until r's EOF, which
// closes it, or until the task's input or the task ends. It pings at a
// third of the idle timeout, so that a reader that stays silent does not
// let the task's input close while Run waits. Problems are notes: the
// task's own end is what Run reports.
func (c *Client) pumpStdin(ctx context.Context, task *bashtaskv1alpha1.BashTask, r io.Reader, notes io.Writer) {
	note := func(format string, args ...any) {
		if notes != nil && ctx.Err() == nil {
			fmt.Fprintf(notes, "task %s: "+format+"\n", append([]any{task.Name}, args...)...)
		}
	}
	w, err := c.Stdin(ctx, task.Namespace, task.Name)
	if err != nil {
		if !apierrors.IsGone(err) {
			note("its stdin: %v", err)
		}
		return
	}
	idle := time.Duration(bashtaskv1alpha1.DefaultStdinIdleTimeoutSeconds) * time.Second
	if s := task.Spec.StdinStream; s != nil && s.IdleTimeoutSeconds != nil {
		idle = time.Duration(*s.IdleTimeoutSeconds) * time.Second
	}
	pctx, stopPing := context.WithCancel(ctx)
	defer stopPing()
	go keepStdinOpen(pctx, w, max(idle/3, 300*time.Millisecond))
	buf := make([]byte, stdinReadBytes)
	for {
		n, rerr := r.Read(buf)
		if n > 0 {
			if _, err := w.Write(buf[:n]); err != nil {
				var ce *StdinClosedError
				if !errors.As(err, &ce) && !apierrors.IsGone(err) {
					note("sending stdin: %v", err)
				}
				return
			}
		}
		if rerr != nil {
			if !errors.Is(rerr, io.EOF) {
				note("reading stdin: %v", rerr)
			}
			if err := w.Close(); err != nil {
				note("closing its stdin: %v", err)
			}
			return
		}
	}
}

// keepStdinOpen pings w every interval until ctx ends or the input closes.
func keepStdinOpen(ctx context.Context, w *StdinWriter, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if _, closed, err := w.Ping(ctx); closed || apierrors.IsGone(err) {
				return
			}
		}
	}
}
