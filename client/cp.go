package client

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	ctrlclient "sigs.k8s.io/controller-runtime/pkg/client"

	bashtaskv1alpha1 "github.com/bashtask/bashtask-operator/api/v1alpha1"
	"github.com/bashtask/bashtask-operator/internal/tarcopy"
)

const (
	// DefaultCopyTimeout is spec.timeoutSeconds of a copy's task when
	// CopyOptions.Timeout is zero: ten minutes (3 GiB at 5 MB/s), the
	// controller's default --max-timeout-seconds, which refuses a longer
	// timeout rather than cut it (docs/api.md).
	DefaultCopyTimeout = 10 * time.Minute
	// copyTTLSeconds deletes a copy's task a day after its end if the
	// client that made it did not (it deletes it itself when done). Long
	// because a slow reader may still be reading a download's stream
	// long after the task ended.
	copyTTLSeconds = 86400
	// copyTailBytes keeps a short tail in status, where the copy reads a
	// failed tar's stderr from; the stdout tail is only the archive's end.
	copyTailBytes = 4096
	// copyEndWait bounds the wait for the end of a copy's task whose input
	// was refused, for the reason it gives (a missing directory).
	copyEndWait = 30 * time.Second
)

// MaxInlineArchiveBytes is the largest archive InlineStdin takes: what
// base64 encodes into spec.stdin's 262144 bytes (spec.stdin is UTF-8
// text, an archive is not).
const MaxInlineArchiveBytes = bashtaskv1alpha1.MaxStdinBytes / 4 * 3

// ErrArchiveTooLarge is returned by CopyTo through InlineStdin when the
// archive is over MaxInlineArchiveBytes.
var ErrArchiveTooLarge = fmt.Errorf("the archive is over %d bytes, the most an upload through spec.stdin (base64) takes", MaxInlineArchiveBytes)

// CopyOptions tune CopyTo and CopyFrom.
type CopyOptions struct {
	// Timeout is spec.timeoutSeconds of the copy's task (whole seconds,
	// 1 s to 7 days; the controller refuses one over its
	// --max-timeout-seconds, and the copy fails InvalidSpec naming it).
	// Zero: DefaultCopyTimeout.
	Timeout time.Duration
	// Stdin gives CopyTo's task its input. Nil: StreamedStdin.
	Stdin StdinOpener
	// TTL is spec.ttlSecondsAfterFinished of the copy's task (whole
	// seconds, rounded up), which matters only when the client cannot
	// delete it when the copy is done. Zero: a day; negative: unset (the
	// controller's default, if any).
	TTL time.Duration
	// SameOwner, for CopyFrom only, gives the local files the archive's
	// numeric owners and keeps their set-user-ID and set-group-ID bits,
	// which are dropped otherwise (tarcopy.ExtractOptions.SameOwner, GNU
	// tar's --same-owner). It needs root. The owners are the workspace's
	// UID on its node, rarely meaningful here.
	SameOwner bool
}

// StdinOpener creates task, whose spec.command extracts a tar archive
// read from standard input, and returns the writer of that input: CopyTo
// writes the archive to it and closes it, then waits for the task's end
// by its name and UID, which the opener must have set on task by then
// (ctrlclient's Create does). An opener that changes the bytes (base64)
// changes spec.command to undo it.
type StdinOpener func(ctx context.Context, c *Client, task *bashtaskv1alpha1.BashTask) (io.WriteCloser, error)

// streamedCopyChunk is the size of the requests StreamedStdin sends, in
// bytes: StdinRequestBytes (4 MiB). A tar of small files is many small
// writes, and one request each would cost a round trip through
// kube-apiserver per header; the requests go one after another, so the
// larger they are, the fewer round trips a copy waits for.
const streamedCopyChunk = StdinRequestBytes

// streamedCopyIdle is the copy task's spec.stdinStream.idleTimeoutSeconds:
// a client that stops writing for this long gets its copy ended by EOF.
const streamedCopyIdle = 300

// StreamedStdin is CopyTo's default input: it creates the task with a
// streamed stdin (spec.stdinStream) and returns a writer that sends the
// archive to bashtasks/stdin in 4 MiB requests (RBAC: create on
// bashtasks/stdin of output.bashtask.dev), resuming at the input offset
// after a dropped connection. Uploads of any size.
func StreamedStdin(ctx context.Context, c *Client, task *bashtaskv1alpha1.BashTask) (io.WriteCloser, error) {
	task.Spec.StdinStream = &bashtaskv1alpha1.StdinStream{IdleTimeoutSeconds: ptr.To[int32](streamedCopyIdle)}
	if err := c.k8s.Create(ctx, task); err != nil {
		return nil, fmt.Errorf("creating the copy's task: %w", err)
	}
	w, err := c.Stdin(ctx, task.Namespace, task.Name)
	if err != nil {
		return nil, fmt.Errorf("opening the stdin of the copy's task %s: %w", task.Name, err)
	}
	return &bufferedStdin{Writer: bufio.NewWriterSize(w, streamedCopyChunk), w: w}, nil
}

// bufferedStdin batches writes into requests of streamedCopyChunk bytes;
// Close sends the rest and closes the input.
type bufferedStdin struct {
	*bufio.Writer
	w *StdinWriter
}

func (b *bufferedStdin) Close() error {
	return errors.Join(b.Flush(), b.w.Close())
}

// InlineStdin is the small-input path of CopyTo: it keeps the archive in
// memory, at most MaxInlineArchiveBytes (else ErrArchiveTooLarge), and at
// Close creates the task with the archive in spec.stdin, base64-encoded,
// and `base64 -d` in front of the command. It needs nothing but the
// BashTask API, so it also serves clusters without streamed stdin.
func InlineStdin(_ context.Context, c *Client, task *bashtaskv1alpha1.BashTask) (io.WriteCloser, error) {
	return &inlineStdin{c: c, task: task}, nil
}

type inlineStdin struct {
	c      *Client
	task   *bashtaskv1alpha1.BashTask
	buf    bytes.Buffer
	closed bool
}

func (w *inlineStdin) Write(p []byte) (int, error) {
	if w.buf.Len()+len(p) > MaxInlineArchiveBytes {
		return 0, ErrArchiveTooLarge
	}
	return w.buf.Write(p)
}

// Close creates the task. Its context is the task creation's own (a
// bounded request), as Close takes none.
func (w *inlineStdin) Close() error {
	if w.closed {
		return nil
	}
	w.closed = true
	w.task.Spec.Stdin = ptr.To(base64.StdEncoding.EncodeToString(w.buf.Bytes()))
	// pipefail: a failed decode fails the task, and a failed extraction
	// keeps its own status (the rightmost failure).
	w.task.Spec.Command = "set -o pipefail\nbase64 -d | {\n" + w.task.Spec.Command + "\n}"
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := w.c.k8s.Create(ctx, w.task); err != nil {
		return fmt.Errorf("creating the copy's task: %w", err)
	}
	return nil
}

// CopyError is a copy whose task did not succeed: tar's complaint (the
// task's stderr) with how the task ended.
type CopyError struct {
	// Task is the copy's BashTask.
	Task string
	// Reason is its status.reason (NonZeroExit for a failed tar).
	Reason bashtaskv1alpha1.Reason
	// ExitCode is its exit code, -1 when it has none.
	ExitCode int
	// Stderr is the end of its stderr, trimmed.
	Stderr string
	// Message is its status.message.
	Message string
}

func (e *CopyError) Error() string {
	what := e.Stderr
	if what == "" {
		what = e.Message
	}
	if e.Reason == bashtaskv1alpha1.ReasonNonZeroExit {
		return fmt.Sprintf("%s (task %s, exit %d)", what, e.Task, e.ExitCode)
	}
	return fmt.Sprintf("%s (task %s ended %s, exit %d)", what, e.Task, e.Reason, e.ExitCode)
}

// CopyTo copies the local file, directory tree or symbolic link
// localPath into workspace as remotePath, as `kubectl cp LOCAL
// POD:PATH` does: onto an existing directory it goes inside it under its
// own name, otherwise it becomes remotePath (whose parent must exist); an
// existing file is replaced. remotePath is relative to the workspace's
// root (/home/task), or absolute with the root as "/" (a leading
// /home/task is the root too), as spec.workingDir; it cannot leave the
// workspace. Modes (less set-user-ID and set-group-ID), symbolic links,
// empty directories and modification times are kept; the files belong
// to the workspace's UID. The copy runs as a task of the workspace with
// its owner (RBAC: get on bashworkspaces, create, get and delete on
// bashtasks); it is deleted when done. A failed extraction is a
// *CopyError.
func (c *Client) CopyTo(ctx context.Context, namespace, workspace, localPath, remotePath string, opts CopyOptions) error {
	ws, err := c.copyWorkspace(ctx, namespace, workspace)
	if err != nil {
		return err
	}
	remote, err := WorkspacePath(remotePath)
	if err != nil {
		return err
	}
	abs, err := filepath.Abs(localPath)
	if err != nil {
		return err
	}
	srcBase := filepath.Base(abs)
	if srcBase == string(filepath.Separator) {
		return errors.New("copying /: name a directory below it")
	}
	if _, err := os.Lstat(localPath); err != nil {
		return err
	}
	command, err := extractCommand(workspace+":"+remotePath, remote, srcBase)
	if err != nil {
		return err
	}
	task, err := copyTask(ws, command, opts)
	if err != nil {
		return err
	}
	open := opts.Stdin
	if open == nil {
		open = StreamedStdin
	}
	w, err := open(ctx, c, task)
	if err != nil {
		return c.inputRefused(ctx, task, err)
	}
	if err := tarcopy.Write(w, localPath); err != nil {
		// The task may exist and wait for the rest of its input.
		_ = w.Close()
		return c.inputRefused(ctx, task, err)
	}
	if err := w.Close(); err != nil {
		return c.inputRefused(ctx, task, err)
	}
	defer c.discardCopyTask(task, false)
	final, err := c.copyTaskEnd(ctx, task)
	if err != nil {
		return err
	}
	return copyResult(final)
}

// CopyFrom copies remotePath of workspace (a file, directory tree or
// symbolic link; paths as in CopyTo) to localPath, as `kubectl cp
// POD:PATH LOCAL` does: a directory becomes localPath (made when
// missing, its parent must exist; merged into when it exists), a file
// becomes localPath, or goes inside it under its own name when localPath
// is an existing directory. The archive is made by GNU tar in a task of
// the workspace (with its owner) and read through the task's log
// (RBAC: get on bashworkspaces, create, get and delete on bashtasks, get
// on bashtasks/log in output.bashtask.dev); it is at most 16 GiB
// (spec.output.spillLimitBytes). It is extracted with tarcopy.Extract,
// which never writes outside localPath whatever names the archive holds,
// and gives every file to the caller without set-ID bits unless
// opts.SameOwner asks for the archive's owners.
// A missing remotePath is a *CopyError "W:PATH: No such file or
// directory"; a refused member a *tarcopy.MemberError.
func (c *Client) CopyFrom(ctx context.Context, namespace, workspace, remotePath, localPath string, opts CopyOptions) error {
	ws, err := c.copyWorkspace(ctx, namespace, workspace)
	if err != nil {
		return err
	}
	remote, err := WorkspacePath(remotePath)
	if err != nil {
		return err
	}
	if opts.SameOwner && os.Geteuid() != 0 {
		return errors.New("keeping the archive's owners (SameOwner) needs root: only root may give a file to another user")
	}
	task, err := copyTask(ws, archiveCommand(workspace+":"+remotePath, remote, workspaceInternalDirs), opts)
	if err != nil {
		return err
	}
	if err := c.k8s.Create(ctx, task); err != nil {
		return fmt.Errorf("creating the copy's task: %w", err)
	}
	defer c.discardCopyTask(task, false)
	r, err := c.FollowLog(ctx, task.Namespace, task.Name, LogOptions{Follow: true})
	if err != nil {
		return fmt.Errorf("reading the archive from task %s: %w", task.Name, err)
	}
	defer r.Close()
	xerr := tarcopy.Extract(r, path.Base(remote), localPath, tarcopy.ExtractOptions{SameOwner: opts.SameOwner})
	var me *tarcopy.MemberError
	if errors.As(xerr, &me) {
		// A refused member: nothing after it is wanted.
		_ = c.Cancel(ctx, task.Namespace, task.Name, task.UID)
		return xerr
	}
	code, serr := readTarStatus(r)
	if xerr == nil && serr == nil && code == 0 {
		// Done: the deferred deletion stops the waiting task; its end
		// has nothing more to say.
		return nil
	}
	// The archive is read: the task may end now (archiveCommand), and
	// its end has tar's stderr.
	if err := c.Cancel(ctx, task.Namespace, task.Name, task.UID); err != nil {
		return errors.Join(xerr, serr, err)
	}
	final, err := c.copyTaskEnd(ctx, task)
	if err != nil {
		return errors.Join(xerr, err)
	}
	if serr != nil {
		// No status line: the task ended before tar did (a missing
		// path, a timeout); its end says why better than a cut archive.
		if err := copyResult(final); err != nil {
			return err
		}
		return errors.Join(xerr, serr)
	}
	if code != 0 {
		// tar's status, with the stderr of the task it was cancelled in.
		e := &CopyError{Task: final.Name}
		if ce := (*CopyError)(nil); errors.As(copyResult(final), &ce) {
			e = ce
		}
		e.Reason, e.ExitCode = bashtaskv1alpha1.ReasonNonZeroExit, code
		return e
	}
	return xerr
}

// tarStatusPrefix starts the line archiveCommand writes after the
// archive, with tar's exit status.
const tarStatusPrefix = "bashtask-cp-tar-exit "

// readTarStatus reads what follows the archive on the stream: tar's
// padding (NUL bytes, at most a record of 10240) and the status line.
func readTarStatus(r io.Reader) (int, error) {
	var rest []byte
	buf := make([]byte, 4096)
	for len(rest) < 1<<16 {
		n, err := r.Read(buf)
		rest = append(rest, buf[:n]...)
		line := bytes.TrimLeft(rest, "\x00")
		if i := bytes.IndexByte(line, '\n'); i >= 0 {
			var code int
			if _, serr := fmt.Sscanf(string(line[:i]), tarStatusPrefix+"%d", &code); serr != nil {
				return 0, fmt.Errorf("after the archive: %q, not tar's status", line[:i])
			}
			return code, nil
		}
		if err != nil {
			return 0, fmt.Errorf("the stream ended after the archive without tar's status: %w", err)
		}
	}
	return 0, errors.New("after the archive: 64 KiB without tar's status")
}

// WorkspacePath returns the absolute path, as a workspace's tasks see
// it, of p: relative to the root (/home/task), or absolute with the root
// as "/" (a leading /home/task is the root too), as spec.workingDir is
// taken; ".." stops at the root. Errors: a NUL byte, a newline (which
// GNU tar's --transform cannot carry), over 4095 bytes (PATH_MAX less
// the NUL).
func WorkspacePath(p string) (string, error) {
	switch {
	case strings.ContainsRune(p, 0):
		return "", fmt.Errorf("workspace path %q: a NUL byte", p)
	case strings.ContainsRune(p, '\n'):
		return "", fmt.Errorf("workspace path %q: a newline", p)
	case len(p) > 4095:
		return "", fmt.Errorf("workspace path: %d bytes, over 4095 (PATH_MAX less the NUL)", len(p))
	}
	root := bashtaskv1alpha1.WorkspacePath
	if rest, ok := strings.CutPrefix(p, root); ok && (rest == "" || rest[0] == '/') {
		p = rest
	}
	return path.Join(root, path.Clean("/"+p)), nil
}

// shellQuote quotes s for bash as one word.
func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

// sedReplacement escapes s for the replacement of a sed s command
// delimited by ",".
func sedReplacement(s string) string {
	return strings.NewReplacer(`\`, `\\`, `&`, `\&`, `,`, `\,`).Replace(s)
}

// missing is the message of a path that is not there, in cp's words.
func missing(spec string) string {
	return shellQuote(spec + ": No such file or directory")
}

// archiveCommand writes a tar of remote (an absolute path in the
// workspace) to stdout, its members named path.Base(remote) and below,
// then a line with tar's exit status, and waits to be cancelled: a task
// that ended is forgotten by its agent at once with upload Never, and
// its stream can then no longer be read, by a follower that was not
// attached yet or one that reconnects. CopyFrom cancels it once it has
// read the status; a client gone, the task's timeout ends it. The
// command does not cd, so the workspace's carried directory stays.
//
// The workspace's own directories below its root (internal, absolute
// paths as tasks see them) that lie inside remote are left out: the
// tasks' /tmp, and the image root's upper and work directories, which
// are root's and which tar could not read.
func archiveCommand(spec, remote string, internal []string) string {
	var exclude strings.Builder
	for _, dir := range internal {
		rel, ok := strings.CutPrefix(dir, strings.TrimSuffix(remote, "/")+"/")
		if !ok {
			continue
		}
		// remote is never / (WorkspacePath): its members are named from
		// its base down.
		exclude.WriteString(" --exclude=" + shellQuote(path.Join(path.Base(remote), rel)))
	}
	return fmt.Sprintf(`p=%s
if [ ! -e "$p" ] && [ ! -L "$p" ]; then printf '%%s\n' %s >&2; exit 2; fi
tar -c -f - --anchored --no-wildcards%s -C %s -- %s
printf '%s%%d\n' "$?"
while :; do sleep 3600; done`, shellQuote(remote), missing(spec), exclude.String(), shellQuote(path.Dir(remote)), shellQuote(path.Base(remote)), tarStatusPrefix)
}

// workspaceInternalDirs are the directories below a workspace's root that
// belong to the node, not to the tasks' files (the names of
// shim.WorkspaceTmpDir and executor.WorkspaceRootDir, which this package
// does not import): a copy out of the workspace leaves them out.
var workspaceInternalDirs = []string{
	bashtaskv1alpha1.WorkspacePath + "/.bashtask-tmp",
	bashtaskv1alpha1.WorkspacePath + "/.bashtask-root",
}

// extractCommand extracts an archive of tarcopy.Write from stdin as
// remote: inside it under srcBase when it is an existing directory,
// else as remote itself. GNU tar's own rules: leading "/" stripped and
// ".." members skipped (its defaults), files owned by the extracting UID
// (--no-same-owner), modes as archived (-p), existing directories'
// modes kept (--no-overwrite-dir), a symbolic link where a directory
// member goes replaced by the directory (its default without
// --keep-directory-symlink). The task's UID and sandbox bound what a
// link already in the workspace could reach (docs/workspaces.md).
func extractCommand(spec, remote, srcBase string) (string, error) {
	if strings.ContainsRune(srcBase, '\n') {
		return "", fmt.Errorf("%q: a name with a newline cannot be copied into a workspace", srcBase)
	}
	transform := func(name string) string {
		// S: symbolic links' targets are not renamed.
		return shellQuote("s," + "^" + tarcopy.Placeholder + "," + sedReplacement(name) + ",S")
	}
	parent := path.Dir(remote)
	return fmt.Sprintf(`d=%s
if [ -d "$d" ]; then c=$d t=%s
elif [ -d %s ]; then c=%s t=%s
else printf '%%s\n' %s >&2; exit 2; fi
tar -x -f - -C "$c" -p --no-same-owner --no-overwrite-dir --transform "$t"`,
		shellQuote(remote), transform(srcBase), shellQuote(parent), shellQuote(parent), transform(path.Base(remote)),
		missing(spec)), nil
}

// copyWorkspace reads the workspace a copy runs in.
func (c *Client) copyWorkspace(ctx context.Context, ns, name string) (*bashtaskv1alpha1.BashWorkspace, error) {
	var ws bashtaskv1alpha1.BashWorkspace
	if err := c.k8s.Get(ctx, ctrlclient.ObjectKey{Namespace: ns, Name: name}, &ws); err != nil {
		return nil, fmt.Errorf("reading workspace %s/%s: %w", ns, name, err)
	}
	return &ws, nil
}

// copyTask is a copy's task: in the workspace, with its owner, the
// archive's stream kept on the node only (never uploaded: the client
// reads it while the task runs) and up to 16 GiB.
func copyTask(ws *bashtaskv1alpha1.BashWorkspace, command string, opts CopyOptions) (*bashtaskv1alpha1.BashTask, error) {
	timeout := opts.Timeout
	if timeout == 0 {
		timeout = DefaultCopyTimeout
	}
	if timeout%time.Second != 0 || timeout < time.Second || timeout > 604800*time.Second {
		return nil, fmt.Errorf("copy timeout %s: whole seconds from 1s to 604800s (spec.timeoutSeconds)", timeout)
	}
	ttl := ptr.To[int32](copyTTLSeconds)
	if opts.TTL != 0 {
		var err error
		if ttl, err = seconds("CopyOptions.TTL", "spec.ttlSecondsAfterFinished", opts.TTL, 0, maxTTLSeconds); err != nil {
			return nil, err
		}
	}
	return &bashtaskv1alpha1.BashTask{
		ObjectMeta: metav1.ObjectMeta{Namespace: ws.Namespace, GenerateName: ws.Name + "-cp-"},
		Spec: bashtaskv1alpha1.BashTaskSpec{
			Command:                 command,
			Workspace:               ptr.To(ws.Name),
			Owner:                   ws.Spec.Owner,
			TimeoutSeconds:          ptr.To(int32(timeout / time.Second)),
			TTLSecondsAfterFinished: ttl,
			Output: &bashtaskv1alpha1.OutputSpec{
				TailBytes:       ptr.To[int32](copyTailBytes),
				SpillLimitBytes: ptr.To[int64](bashtaskv1alpha1.MaxSpillLimitBytes),
				Upload:          ptr.To(bashtaskv1alpha1.UploadNever),
			},
		},
	}, nil
}

// copyTaskEnd waits, on a watch of the task, until it has its terminal
// reason.
func (c *Client) copyTaskEnd(ctx context.Context, task *bashtaskv1alpha1.BashTask) (*bashtaskv1alpha1.BashTask, error) {
	res, err := c.Wait(ctx, task, RunOptions{})
	if err != nil {
		return nil, fmt.Errorf("waiting for the copy's task %s: %w", task.Name, err)
	}
	return res.Task, nil
}

// inputRefused handles an upload whose input failed: when the task
// closed its input or ended first (it found no directory to extract to,
// say), its end says why, in tar's or cp's words naming the path, and
// that is the error rather than the input's. Otherwise the task is
// cancelled and err returned. Either way the task is deleted.
func (c *Client) inputRefused(ctx context.Context, task *bashtaskv1alpha1.BashTask, err error) error {
	var ce *StdinClosedError
	if task.UID == "" || (!errors.As(err, &ce) && !apierrors.IsGone(err)) {
		c.discardCopyTask(task, true)
		return err
	}
	wctx, cancel := context.WithTimeout(ctx, copyEndWait)
	defer cancel()
	final, werr := c.copyTaskEnd(wctx, task)
	c.discardCopyTask(task, werr != nil)
	if werr != nil {
		return errors.Join(err, werr)
	}
	if rerr := copyResult(final); rerr != nil {
		return rerr
	}
	return err
}

// copyResult is nil for a task that succeeded, else its *CopyError.
func copyResult(t *bashtaskv1alpha1.BashTask) error {
	reason := ptr.Deref(t.Status.Reason, "")
	if reason == bashtaskv1alpha1.ReasonSucceeded {
		return nil
	}
	e := &CopyError{Task: t.Name, Reason: reason, ExitCode: int(ptr.Deref(t.Status.ExitCode, -1)), Message: ptr.Deref(t.Status.Message, "")}
	if t.Status.Stderr != nil {
		e.Stderr = strings.TrimSpace(ptr.Deref(t.Status.Stderr.Tail, ""))
	}
	return e
}

// discardCopyTask deletes a copy's task (cancelling it first when it may
// still wait for input), on a context of its own: the copy's may have
// ended. A task not created yet is left alone; one that cannot be
// deleted goes with its TTL.
func (c *Client) discardCopyTask(task *bashtaskv1alpha1.BashTask, cancel bool) {
	if task.Name == "" {
		return
	}
	ctx, stop := context.WithTimeout(context.Background(), 30*time.Second)
	defer stop()
	if cancel {
		_ = c.Cancel(ctx, task.Namespace, task.Name, task.UID)
	}
	_ = c.k8s.Delete(ctx, task, ctrlclient.Preconditions{UID: &task.UID})
}
