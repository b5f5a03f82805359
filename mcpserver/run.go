package mcpserver

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"k8s.io/utils/ptr"

	bashtaskv1alpha1 "github.com/bashtask/bashtask-operator/api/v1alpha1"
	btclient "github.com/bashtask/bashtask-operator/client"
)

// Bounds of run's tails, in bytes.
const (
	defaultTailBytes = 16 << 10
	maxTailBytes     = 64 << 10
)

// progressInterval is how often run notifies progress while its command
// runs, when the client asked for progress.
const progressInterval = time.Second

// RunInput is run's and start's input.
type RunInput struct {
	Workspace      string `json:"workspace" jsonschema:"the workspace to run in"`
	Command        string `json:"command" jsonschema:"the shell command, run with bash -c in the workspace (e.g. 'cd repo && make test 2>&1')"`
	TimeoutSeconds int    `json:"timeout_seconds,omitempty" jsonschema:"the command's own time limit in seconds once it runs; 0: 120; at most the cluster's cap (600 unless changed)"`
	WorkingDir     string `json:"working_dir,omitempty" jsonschema:"directory to start in, relative to the workspace's home /home/task; empty: where the last command left off"`
	TailBytes      int    `json:"tail_bytes,omitempty" jsonschema:"run only: how many of the last bytes of each stream to return; 0: 16384; at most 65536"`
	Stdin          bool   `json:"stdin,omitempty" jsonschema:"start only: give the command a standard input that write_stdin writes and closes"`
}

// RunOutput is how a command of run ended.
type RunOutput struct {
	Task              string `json:"task" jsonschema:"the task's name: read_output reads all of its output by byte offset"`
	ExitCode          int    `json:"exit_code" jsonschema:"the command's exit code (128+n for signal n; -1 when it has none)"`
	Reason            string `json:"reason" jsonschema:"Succeeded, NonZeroExit, TimedOut, Cancelled, InvalidSpec, ..."`
	Message           string `json:"message,omitempty"`
	Stdout            string `json:"stdout" jsonschema:"the tail of standard output"`
	StdoutEncoding    string `json:"stdout_encoding" jsonschema:"text, or base64 when the tail is not UTF-8"`
	StdoutTailOffset  int64  `json:"stdout_tail_offset" jsonschema:"byte offset of the tail's first byte in standard output"`
	StdoutBytes       int64  `json:"stdout_bytes" jsonschema:"total bytes of standard output"`
	Stderr            string `json:"stderr" jsonschema:"the tail of standard error"`
	StderrEncoding    string `json:"stderr_encoding"`
	StderrTailOffset  int64  `json:"stderr_tail_offset"`
	StderrBytes       int64  `json:"stderr_bytes"`
	LeftoverProcesses int    `json:"leftover_processes,omitempty" jsonschema:"background processes the command left, which were stopped: use start for a service"`
}

// StartOutput names a started task.
type StartOutput struct {
	Task string `json:"task" jsonschema:"the task's name, for read_output, write_stdin and cancel"`
}

func (s *Server) addRunTools() {
	mcp.AddTool(s.mcp, &mcp.Tool{Name: "run", InputSchema: inputSchema[RunInput](),
		Description: "Run a shell command in a workspace and wait for it to end. Returns the exit code and the last bytes of stdout and stderr " +
			"with their byte offsets (read_output reads the rest). Sends progress notifications while it runs; cancelling the request cancels the command. " +
			"Background processes end with the command: use start for servers and long jobs."},
		s.run)
	mcp.AddTool(s.mcp, &mcp.Tool{Name: "start", InputSchema: inputSchema[RunInput](),
		Description: "Start a shell command in a workspace in the background and return its task name at once. " +
			"Read its output with read_output from byte offset 0 on, write its input with write_stdin (with stdin true), stop it with cancel."},
		s.start)
}

// runOptions are the client's options of in, with the server's owner.
func (s *Server) runOptions(in RunInput) (btclient.RunOptions, error) {
	if in.Workspace == "" || in.Command == "" {
		return btclient.RunOptions{}, errors.New("workspace and command are required")
	}
	if in.TimeoutSeconds < 0 {
		return btclient.RunOptions{}, errors.New("timeout_seconds must be positive")
	}
	return btclient.RunOptions{Namespace: s.cfg.Namespace, Workspace: in.Workspace, Owner: s.cfg.Owner, Command: in.Command,
		WorkingDir: in.WorkingDir, Timeout: time.Duration(in.TimeoutSeconds) * time.Second, GenerateName: "mcp-"}, nil
}

func (s *Server) run(ctx context.Context, req *mcp.CallToolRequest, in RunInput) (*mcp.CallToolResult, RunOutput, error) {
	c, err := s.client(req.Extra)
	if err != nil {
		return nil, RunOutput{}, err
	}
	opts, err := s.runOptions(in)
	if err != nil {
		return nil, RunOutput{}, err
	}
	if err := s.ownWorkspace(ctx, c, in.Workspace); err != nil {
		return nil, RunOutput{}, err
	}
	task, err := c.Start(ctx, opts)
	if err != nil {
		return nil, RunOutput{}, explain(err)
	}
	n := clamp(in.TailBytes, defaultTailBytes, maxTailBytes)
	stdout, stderr := &tailBuffer{max: n}, &tailBuffer{max: n}
	stop := s.notifyProgress(ctx, req, task.Name, stdout, stderr)
	res, err := c.Wait(ctx, task, btclient.RunOptions{Stdout: stdout, Stderr: stderr, WaitTimeout: waitBound(in.TimeoutSeconds)})
	stop()
	if ctx.Err() != nil {
		// The client cancelled the request (or went away): the command
		// is cancelled with it.
		cerr := c.Cancel(context.WithoutCancel(ctx), task.Namespace, task.Name, task.UID)
		return nil, RunOutput{}, errors.Join(fmt.Errorf("the request was cancelled; task %s was asked to stop", task.Name), cerr)
	}
	if res == nil {
		return nil, RunOutput{}, explain(err)
	}
	return nil, runOutput(task.Name, res, stdout, stderr), nil
}

// pendingAllowance is how long run waits for its command to start, on
// top of the command's own limit, before it cancels it: a workspace being
// restored, a node at its limit of tasks.
const pendingAllowance = 2 * time.Minute

// waitBound is run's whole wait: the command's limit (the API's default,
// 120 s, when unset) and pendingAllowance.
func waitBound(timeoutSeconds int) time.Duration {
	if timeoutSeconds == 0 {
		timeoutSeconds = 120
	}
	return time.Duration(timeoutSeconds)*time.Second + pendingAllowance
}

func runOutput(name string, res *btclient.Result, stdout, stderr *tailBuffer) RunOutput {
	o := RunOutput{Task: name, ExitCode: res.ExitCode, Reason: string(res.Reason), Message: res.Message, LeftoverProcesses: res.LeftoverProcesses}
	o.Stdout, o.StdoutEncoding, o.StdoutTailOffset, o.StdoutBytes = tailOf(stdout)
	o.Stderr, o.StderrEncoding, o.StderrTailOffset, o.StderrBytes = tailOf(stderr)
	return o
}

// tailOf encodes a tail, starting it at a whole UTF-8 character when it
// was cut inside one.
func tailOf(t *tailBuffer) (data, encoding string, offset, total int64) {
	b, offset, total := t.snapshot()
	for i := 0; i < utf8.UTFMax-1 && offset > 0 && len(b) > 0 && !utf8.RuneStart(b[0]); i++ {
		b, offset = b[1:], offset+1
	}
	data, encoding = encode(b)
	return data, encoding, offset, total
}

// notifyProgress sends a progress notification every progressInterval
// while the command runs, when the request has a progress token; call
// stop when it has ended.
func (s *Server) notifyProgress(ctx context.Context, req *mcp.CallToolRequest, task string, stdout, stderr *tailBuffer) (stop func()) {
	token := req.Params.GetProgressToken()
	if token == nil || req.Session == nil {
		return func() {}
	}
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		start := time.Now()
		t := time.NewTicker(progressInterval)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			_, _, out := stdout.snapshot()
			_, _, errBytes := stderr.snapshot()
			elapsed := time.Since(start).Round(time.Second)
			_ = req.Session.NotifyProgress(ctx, &mcp.ProgressNotificationParams{ProgressToken: token, Progress: elapsed.Seconds(),
				Message: fmt.Sprintf("task %s running for %s: %d bytes of stdout, %d of stderr", task, elapsed, out, errBytes)})
		}
	}()
	return func() { cancel(); <-done }
}

func (s *Server) start(ctx context.Context, req *mcp.CallToolRequest, in RunInput) (*mcp.CallToolResult, StartOutput, error) {
	c, err := s.client(req.Extra)
	if err != nil {
		return nil, StartOutput{}, err
	}
	opts, err := s.runOptions(in)
	if err != nil {
		return nil, StartOutput{}, err
	}
	if err := s.ownWorkspace(ctx, c, in.Workspace); err != nil {
		return nil, StartOutput{}, err
	}
	if in.Stdin {
		opts.StdinStream = strings.NewReader("")
	}
	task, err := c.Start(ctx, opts)
	if err != nil {
		return nil, StartOutput{}, explain(err)
	}
	return nil, StartOutput{Task: task.Name}, nil
}

// ownTask reads the task and refuses one of another owner.
func (s *Server) ownTask(ctx context.Context, c *btclient.Client, name string) (*bashtaskv1alpha1.BashTask, error) {
	if name == "" {
		return nil, errors.New("task is required (the name run or start returned)")
	}
	t, err := c.GetTask(ctx, s.cfg.Namespace, name)
	if err != nil {
		return nil, explain(err)
	}
	if owner := ptr.Deref(t.Spec.Owner, ""); owner != s.cfg.Owner {
		return nil, fmt.Errorf("task %s belongs to owner %q, not to this server's owner %q", name, owner, s.cfg.Owner)
	}
	return t, nil
}
