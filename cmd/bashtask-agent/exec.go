package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/sys/unix"

	"github.com/bashtask/bashtask-operator/executor"
)

// execOptions are the flags of `bashtask-agent exec`.
type execOptions struct {
	timeout      time.Duration
	grace        time.Duration
	tailBytes    int
	spillLimit   int64
	spillDir     string
	stdinFile    string
	env          []string
	ambientEnv   string
	allow        []string
	shell        string
	workDir      string
	cgroups      string
	cgroupParent string
}

// execStream and execOutput are the JSON printed by `exec`: exactly these
// keys, stable for scripts.
type execStream struct {
	Tail          string `json:"tail"`
	TotalBytes    int64  `json:"totalBytes"`
	Truncated     bool   `json:"truncated"`
	Sanitized     bool   `json:"sanitized"`
	SHA256        string `json:"sha256"`
	SpillPath     string `json:"spillPath"`
	SpillBytes    int64  `json:"spillBytes"`
	SpillComplete bool   `json:"spillComplete"`
}

type execOutput struct {
	Reason            string     `json:"reason"`
	ExitCode          int        `json:"exitCode"`
	Signal            string     `json:"signal"`
	LeftoverProcesses int        `json:"leftoverProcesses"`
	Mechanism         string     `json:"mechanism"`
	Stdout            execStream `json:"stdout"`
	Stderr            execStream `json:"stderr"`
}

// errStartFailed marks the exit of a command that did not start, after its
// JSON was printed.
var errStartFailed = errors.New("command did not start")

func newExecCommand() *cobra.Command {
	o := &execOptions{}
	cmd := &cobra.Command{
		Use:   "exec [flags] -- COMMAND",
		Short: "Run one command through the executor and print its result as JSON",
		Long: `Run one command the way the agent runs a task (environment scrub, new
session, cgroup where available, timeout, TERM/grace/KILL, output capture)
and print the result as one JSON object. Several arguments after -- are
joined with spaces into one command string for the shell.

The exit status is 0 whenever the command ran, whatever its outcome; it is
1 when it could not start (the JSON then has reason StartFailed).`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return runExec(cmd.Context(), o, strings.Join(args, " "), cmd.InOrStdin(), cmd.OutOrStdout(), cmd.ErrOrStderr())
		},
	}
	f := cmd.Flags()
	f.DurationVar(&o.timeout, "timeout", 120*time.Second, "deadline of the command; 0 for none")
	f.DurationVar(&o.grace, "grace", executor.DefaultKillGrace, "time between SIGTERM and SIGKILL")
	f.IntVar(&o.tailBytes, "tail-bytes", executor.DefaultTailBytes, "bytes of each stream kept in the result")
	f.Int64Var(&o.spillLimit, "spill-limit-bytes", executor.DefaultSpillLimitBytes, "cap of each stream's spill file in bytes")
	f.StringVar(&o.spillDir, "spill-dir", "", "directory for the spill files (created 0700); default a fresh temporary directory")
	f.StringVar(&o.stdinFile, "stdin-file", "", "file whose bytes are the command's stdin ('-' for this process's stdin); default /dev/null")
	f.StringArrayVar(&o.env, "env", nil, "explicit environment entry NAME=VALUE (repeatable)")
	f.StringVar(&o.ambientEnv, "ambient-env", "", "how much of this process's environment passes: allowlist, scrub or inherit (default: the isolation level's, allowlist at tenant, scrub at process)")
	f.StringSliceVar(&o.allow, "ambient-allow", nil, "names passed in allowlist mode")
	f.StringVar(&o.shell, "shell", executor.DefaultShell, "absolute path of the shell")
	f.StringVar(&o.workDir, "workdir", "", "working directory; default a fresh temporary directory")
	f.StringVar(&o.cgroups, "cgroups", string(executor.CgroupAuto), "cgroup use: auto, off or required")
	f.StringVar(&o.cgroupParent, "cgroup-parent", executor.DefaultCgroupParent, "name of the parent cgroup of tasks")
	return cmd
}

func runExec(ctx context.Context, o *execOptions, command string, stdin io.Reader, stdout, stderr io.Writer) error {
	if ctx == nil {
		ctx = context.Background()
	}
	mode, err := executor.ParseAmbientMode(o.ambientEnv)
	if err != nil {
		return err
	}
	spec := executor.Spec{
		Command:         command,
		WorkingDir:      o.workDir,
		Timeout:         o.timeout,
		KillGrace:       o.grace,
		TailBytes:       o.tailBytes,
		SpillLimitBytes: o.spillLimit,
		SpillDir:        o.spillDir,
	}
	for _, kv := range o.env {
		name, value, ok := strings.Cut(kv, "=")
		if !ok {
			return fmt.Errorf("--env %q: want NAME=VALUE", kv)
		}
		spec.Env = append(spec.Env, executor.EnvVar{Name: name, Value: value})
	}
	switch o.stdinFile {
	case "":
	case "-":
		if spec.Stdin, err = io.ReadAll(stdin); err != nil {
			return fmt.Errorf("reading stdin: %w", err)
		}
	default:
		if spec.Stdin, err = os.ReadFile(o.stdinFile); err != nil {
			return fmt.Errorf("reading --stdin-file: %w", err)
		}
	}

	// Like the agent: orphans of the command are re-parented to this
	// process and reaped.
	if err := executor.BecomeSubreaper(); err != nil && !errors.Is(err, executor.ErrUnsupported) {
		return err
	}
	ex, err := executor.New(executor.Config{
		Shell:            o.shell,
		AmbientEnv:       mode,
		AmbientAllowlist: o.allow,
		Cgroups:          executor.CgroupMode(o.cgroups),
		CgroupParent:     o.cgroupParent,
	})
	if err != nil {
		return err
	}
	defer ex.Close()

	task, err := ex.Start(spec)
	if err != nil {
		var se *executor.StartError
		if !errors.As(err, &se) {
			return err
		}
		fmt.Fprintln(stderr, "bashtask-agent exec:", err)
		if werr := writeResult(stdout, executor.StartFailedResult(err)); werr != nil {
			return werr
		}
		return errStartFailed
	}

	// SIGINT or SIGTERM cancel the command (TERM, grace, KILL) and still
	// print its result.
	sigCtx, stop := signal.NotifyContext(ctx, os.Interrupt, unix.SIGTERM)
	defer stop()
	go func() {
		select {
		case <-sigCtx.Done():
			task.Cancel()
		case <-task.Done():
		}
	}()
	res, err := task.Wait(context.WithoutCancel(ctx))
	if err != nil {
		return err
	}
	return writeResult(stdout, res)
}

func writeResult(w io.Writer, r executor.Result) error {
	out := execOutput{
		Reason:            string(r.Reason),
		ExitCode:          r.ExitCode,
		Signal:            r.Signal,
		LeftoverProcesses: r.LeftoverProcesses,
		Mechanism:         string(r.Mechanism),
		Stdout:            toExecStream(r.Stdout),
		Stderr:            toExecStream(r.Stderr),
	}
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	return enc.Encode(out)
}

func toExecStream(s executor.StreamResult) execStream {
	return execStream{
		Tail:          s.Tail,
		TotalBytes:    s.TotalBytes,
		Truncated:     s.Truncated,
		Sanitized:     s.Sanitized,
		SHA256:        s.SHA256,
		SpillPath:     s.SpillPath,
		SpillBytes:    s.SpillBytes,
		SpillComplete: s.SpillComplete,
	}
}
