package mcpserver

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"k8s.io/utils/ptr"

	bashtaskv1alpha1 "github.com/bashtask/bashtask-operator/api/v1alpha1"
	btclient "github.com/bashtask/bashtask-operator/client"
)

// Bounds of read_output, in bytes and seconds.
const (
	defaultReadBytes = 16 << 10
	maxReadBytes     = 256 << 10
	maxWaitSeconds   = 60
	// settle is how long read_output keeps reading once a byte came, for
	// the bytes that follow it at once.
	settle = 200 * time.Millisecond
)

// ReadOutputInput is read_output's input.
type ReadOutputInput struct {
	Task        string `json:"task" jsonschema:"the task's name, from run or start"`
	Stream      string `json:"stream,omitempty" jsonschema:"stdout (the default) or stderr"`
	Offset      int64  `json:"offset,omitempty" jsonschema:"the first byte wanted; pass the last call's next_offset to continue"`
	MaxBytes    int    `json:"max_bytes,omitempty" jsonschema:"at most this many bytes; 0: 16384; at most 262144"`
	WaitSeconds int    `json:"wait_seconds,omitempty" jsonschema:"when no byte is there yet and the task runs, wait up to this long for one (0 to 60)"`
}

// ReadOutputOutput is a slice of a task's stream and the task's state.
type ReadOutputOutput struct {
	Data       string `json:"data"`
	Encoding   string `json:"encoding" jsonschema:"text, or base64 when the bytes are not UTF-8"`
	Offset     int64  `json:"offset" jsonschema:"byte offset of data's first byte"`
	NextOffset int64  `json:"next_offset" jsonschema:"the offset to read from next"`
	Phase      string `json:"phase" jsonschema:"the task's phase: Pending, Running, Succeeded or Failed"`
	Finished   bool   `json:"finished" jsonschema:"the task has ended: once next_offset reaches total_bytes there is nothing more"`
	TotalBytes *int64 `json:"total_bytes,omitempty" jsonschema:"the stream's size, once the task has ended"`
	ExitCode   *int32 `json:"exit_code,omitempty"`
	Reason     string `json:"reason,omitempty"`
}

// StdinInput is write_stdin's input.
type StdinInput struct {
	Task     string `json:"task" jsonschema:"a task started with stdin true"`
	Data     string `json:"data,omitempty" jsonschema:"the bytes to write (include a trailing newline for a line)"`
	Encoding string `json:"encoding,omitempty" jsonschema:"text (the default) or base64"`
	Close    bool   `json:"close,omitempty" jsonschema:"close the input after data (the command reads end of file)"`
}

// StdinOutput is where the task's input stands.
type StdinOutput struct {
	Offset int64 `json:"offset" jsonschema:"bytes of input the task accepted so far"`
	Closed bool  `json:"closed"`
}

// TaskInput names a task.
type TaskInput struct {
	Task string `json:"task" jsonschema:"the task's name, from run or start"`
}

// CancelOutput says a task was asked to stop.
type CancelOutput struct {
	Task  string `json:"task"`
	Phase string `json:"phase" jsonschema:"its phase when it was asked; it ends Cancelled soon after"`
}

func (s *Server) addOutputTools() {
	mcp.AddTool(s.mcp, &mcp.Tool{Name: "read_output", InputSchema: inputSchema[ReadOutputInput](),
		Description: "Read a task's stdout or stderr from a byte offset, while it runs and after. Returns the bytes, next_offset to continue from, " +
			"and whether the task has finished (with its exit code). Poll with wait_seconds to wait for new output."},
		s.readOutput)
	mcp.AddTool(s.mcp, &mcp.Tool{Name: "write_stdin", InputSchema: inputSchema[StdinInput](),
		Description: "Write to the standard input of a running task that was started with stdin true; close it to send end of file."},
		s.writeStdin)
	mcp.AddTool(s.mcp, &mcp.Tool{Name: "cancel", InputSchema: inputSchema[TaskInput](),
		Description: "Cancel a running task: SIGTERM, then SIGKILL after its grace period. Idempotent."},
		s.cancel)
}

func (s *Server) readOutput(ctx context.Context, req *mcp.CallToolRequest, in ReadOutputInput) (*mcp.CallToolResult, ReadOutputOutput, error) {
	c, err := s.client(req.Extra)
	if err != nil {
		return nil, ReadOutputOutput{}, err
	}
	if _, err := s.ownTask(ctx, c, in.Task); err != nil {
		return nil, ReadOutputOutput{}, err
	}
	stream := in.Stream
	if stream == "" {
		stream = "stdout"
	}
	if stream != "stdout" && stream != "stderr" {
		return nil, ReadOutputOutput{}, fmt.Errorf("stream %q: stdout or stderr", in.Stream)
	}
	b, err := readSlice(ctx, c, s.cfg.Namespace, in, stream)
	if err != nil {
		return nil, ReadOutputOutput{}, explain(err)
	}
	t, err := c.GetTask(ctx, s.cfg.Namespace, in.Task)
	if err != nil {
		return nil, ReadOutputOutput{}, explain(err)
	}
	o := ReadOutputOutput{Offset: in.Offset, NextOffset: in.Offset + int64(len(b)), Phase: string(ptr.Deref(t.Status.Phase, ""))}
	o.Data, o.Encoding = encode(b)
	o.Finished = o.Phase == string(bashtaskv1alpha1.PhaseSucceeded) || o.Phase == string(bashtaskv1alpha1.PhaseFailed)
	if o.Finished {
		o.ExitCode, o.Reason = t.Status.ExitCode, string(ptr.Deref(t.Status.Reason, ""))
		st := t.Status.Stdout
		if stream == "stderr" {
			st = t.Status.Stderr
		}
		// A task that ended before it ran has no stream: 0 bytes.
		o.TotalBytes = ptr.To[int64](0)
		if st != nil && st.TotalBytes != nil {
			o.TotalBytes = st.TotalBytes
		}
	}
	return nil, o, nil
}

// readSlice reads at most in.MaxBytes of the stream from in.Offset:
// what is there, or, with in.WaitSeconds, what comes within it (and
// settle after the first byte).
func readSlice(ctx context.Context, c *btclient.Client, ns string, in ReadOutputInput, stream string) ([]byte, error) {
	wait := time.Duration(min(max(in.WaitSeconds, 0), maxWaitSeconds)) * time.Second
	ctx, cancel := context.WithTimeout(ctx, wait+settle)
	defer cancel()
	r, err := c.FollowLog(ctx, ns, in.Task, btclient.LogOptions{Stream: stream, Offset: in.Offset, Follow: wait > 0})
	if err != nil {
		return nil, err
	}
	chunks := make(chan []byte)
	errc := make(chan error, 1)
	// The reader is the goroutine's alone, closed by it: collect may
	// return while a Read is under way, which ctx's end then ends.
	go func() {
		defer func() { _ = r.Close() }()
		for {
			buf := make([]byte, 32<<10)
			n, err := r.Read(buf)
			if n > 0 {
				select {
				case chunks <- buf[:n]:
				case <-ctx.Done():
					return
				}
			}
			if err != nil {
				errc <- err
				return
			}
		}
	}()
	return collect(ctx, chunks, errc, clamp(in.MaxBytes, defaultReadBytes, maxReadBytes))
}

// collect gathers chunks until limit bytes, the stream's end, ctx's end,
// or settle after the first chunk.
func collect(ctx context.Context, chunks <-chan []byte, errc <-chan error, limit int) ([]byte, error) {
	var out []byte
	var settled <-chan time.Time
	for len(out) < limit {
		select {
		case b := <-chunks:
			out = append(out, b...)
			if settled == nil {
				settled = time.After(settle)
			}
		case err := <-errc:
			if errors.Is(err, io.EOF) || ctx.Err() != nil {
				return out, nil
			}
			return out, err
		case <-settled:
			return out, nil
		case <-ctx.Done():
			return out, nil
		}
	}
	return out[:limit], nil
}

func (s *Server) writeStdin(ctx context.Context, req *mcp.CallToolRequest, in StdinInput) (*mcp.CallToolResult, StdinOutput, error) {
	c, err := s.client(req.Extra)
	if err != nil {
		return nil, StdinOutput{}, err
	}
	data := []byte(in.Data)
	switch in.Encoding {
	case "", encodingText:
	case encodingBase64:
		if data, err = base64.StdEncoding.DecodeString(in.Data); err != nil {
			return nil, StdinOutput{}, fmt.Errorf("data is not base64: %w", err)
		}
	default:
		return nil, StdinOutput{}, fmt.Errorf("encoding %q: text or base64", in.Encoding)
	}
	if _, err := s.ownTask(ctx, c, in.Task); err != nil {
		return nil, StdinOutput{}, err
	}
	w, err := c.Stdin(ctx, s.cfg.Namespace, in.Task)
	if err != nil {
		return nil, StdinOutput{}, fmt.Errorf("%w (only a running task started with stdin true takes input)", explain(err))
	}
	if len(data) > 0 {
		if _, err := w.Write(data); err != nil {
			return nil, StdinOutput{}, explain(err)
		}
	}
	if in.Close {
		if err := w.Close(); err != nil {
			return nil, StdinOutput{}, explain(err)
		}
	}
	return nil, StdinOutput{Offset: w.Offset(), Closed: in.Close}, nil
}

func (s *Server) cancel(ctx context.Context, req *mcp.CallToolRequest, in TaskInput) (*mcp.CallToolResult, CancelOutput, error) {
	c, err := s.client(req.Extra)
	if err != nil {
		return nil, CancelOutput{}, err
	}
	t, err := s.ownTask(ctx, c, in.Task)
	if err != nil {
		return nil, CancelOutput{}, err
	}
	if err := c.Cancel(ctx, t.Namespace, t.Name, t.UID); err != nil {
		return nil, CancelOutput{}, explain(err)
	}
	return nil, CancelOutput{Task: t.Name, Phase: string(ptr.Deref(t.Status.Phase, ""))}, nil
}
