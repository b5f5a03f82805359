package outputapi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/streaming/pkg/httpstream/wsstream"

	agentv1 "github.com/bashtask/bashtask-operator/api/agent/v1"
	outputv1alpha1 "github.com/bashtask/bashtask-operator/api/output/v1alpha1"
	bashtaskv1alpha1 "github.com/bashtask/bashtask-operator/api/v1alpha1"
)

// attachProtocol is the WebSocket subprotocol of bashtasks/attach, the
// remote command protocol's version 5, which kube-apiserver serves for
// `kubectl exec` and `kubectl attach` and client-go's WebSocket executor
// asks for first.
const attachProtocol = "v5.channel.k8s.io"

// attachIdleTimeout is the read and write deadline of an attach's
// connection, renewed by every message: kube-apiserver's for remote
// command WebSockets, 4 hours.
const attachIdleTimeout = 4 * time.Hour

// attachInputBytes is the most input one read of channel 0 takes, and so
// the most one TerminalInput carries: 32 KiB, within the agent's
// TerminalInputBytes. With the output chunk the agent sends (at most 1
// MiB) it bounds what a session holds.
const attachInputBytes = 32 << 10

// attachStreams are the channels of an attach's WebSocket (wsstream).
type attachStreams struct {
	conn   *wsstream.Conn
	stdin  io.Reader // nil without AttachOptions.Stdin
	stdout io.Writer
	errors io.Writer
	resize io.Reader
}

// openAttachStreams upgrades the request to a WebSocket of attachProtocol
// with the channels of an attach (outputv1alpha1.ChannelStdin and the
// rest), as kube-apiserver opens one for a remote command; on an error
// the upgrade has answered the client.
func openAttachStreams(w http.ResponseWriter, req *http.Request, stdin bool) (*attachStreams, error) {
	in := wsstream.IgnoreChannel
	if stdin {
		in = wsstream.ReadChannel
	}
	channels := []wsstream.ChannelType{
		outputv1alpha1.ChannelStdin:  in,
		outputv1alpha1.ChannelStdout: wsstream.WriteChannel,
		2:                            wsstream.IgnoreChannel, // stderr: a terminal has one output
		outputv1alpha1.ChannelError:  wsstream.WriteChannel,
		outputv1alpha1.ChannelResize: wsstream.ReadChannel,
	}
	conn := wsstream.NewConn(map[string]wsstream.ChannelProtocolConfig{
		attachProtocol: {Binary: true, Channels: channels},
	})
	conn.SetIdleTimeout(attachIdleTimeout)
	_, rw, err := conn.Open(w, req)
	if err != nil {
		return nil, err
	}
	// An empty message on the output channel tells the client the
	// session is open.
	if _, err := rw[outputv1alpha1.ChannelStdout].Write(nil); err != nil {
		conn.Close()
		return nil, err
	}
	st := &attachStreams{conn: conn, stdout: rw[outputv1alpha1.ChannelStdout], errors: rw[outputv1alpha1.ChannelError], resize: rw[outputv1alpha1.ChannelResize]}
	if stdin {
		st.stdin = rw[outputv1alpha1.ChannelStdin]
	}
	return st, nil
}

// runAttach relays one open session until the task ends (its exit code is
// sent on the error channel) or the client goes away (the task runs on).
func (s *Server) runAttach(ctx context.Context, sess *terminalSession, st *attachStreams) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	inputs := make(chan *agentv1.TerminalInput)
	clientGone := make(chan struct{})
	if st.stdin != nil {
		go readInput(ctx, st.stdin, inputs)
	}
	go func() {
		readResizes(ctx, st.resize, inputs)
		close(clientGone) // the resize channel ends with the connection
	}()
	outDone := make(chan error, 1)
	go func() { outDone <- pumpOutput(ctx, sess, st.stdout) }()
	closed := make(chan struct{})
	go func() {
		for {
			ev, err := sess.stream.Recv()
			if err != nil || ev.GetClosed() {
				close(closed)
				return
			}
		}
	}()
	for {
		select {
		case in := <-inputs:
			if err := sess.stream.Send(in); err != nil {
				inputs = nil // the agent ended the session: its end comes on closed
			}
		case err := <-outDone:
			s.endAttach(ctx, sess, st, err)
			return
		case <-clientGone:
			return
		case <-closed:
			closed = nil // the output's end follows, and with it the exit code
		}
	}
}

// readInput sends what the client types (channel 0) to inputs, a read of
// at most attachInputBytes at a time, until the channel ends.
func readInput(ctx context.Context, r io.Reader, inputs chan<- *agentv1.TerminalInput) {
	buf := make([]byte, attachInputBytes)
	for {
		n, err := r.Read(buf)
		if n > 0 {
			select {
			case inputs <- &agentv1.TerminalInput{Data: append([]byte(nil), buf[:n]...)}:
			case <-ctx.Done():
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// terminalSize is a window size on the resize channel, as client-go's
// remotecommand.TerminalSize encodes it.
type terminalSize struct {
	Width  uint16
	Height uint16
}

// readResizes sends the client's window sizes (channel 4, JSON) to
// inputs until the channel ends.
func readResizes(ctx context.Context, r io.Reader, inputs chan<- *agentv1.TerminalInput) {
	dec := json.NewDecoder(r)
	for {
		var sz terminalSize
		if err := dec.Decode(&sz); err != nil {
			return
		}
		if sz.Width == 0 || sz.Height == 0 {
			continue // not a size a terminal can have
		}
		select {
		case inputs <- &agentv1.TerminalInput{Resize: &agentv1.WindowSize{Rows: uint32(sz.Height), Cols: uint32(sz.Width)}}:
		case <-ctx.Done():
			return
		}
	}
}

// pumpOutput copies the task's stdout from the session's replay offset to
// w until the stream ends (nil) or fails.
func pumpOutput(ctx context.Context, sess *terminalSession, w io.Writer) error {
	stream, err := sess.out.ReadOutput(ctx, &agentv1.ReadOutputRequest{Uid: string(sess.task.UID), Offset: sess.replay, Follow: true})
	if err != nil {
		return err
	}
	for {
		m, err := stream.Recv()
		if err != nil {
			return err
		}
		if len(m.GetData()) > 0 {
			if _, err := w.Write(m.GetData()); err != nil {
				return err
			}
		}
		if m.GetEnd() != nil {
			return nil
		}
	}
}

// endAttach sends the session's end on the error channel: the task's exit
// code once its status has it (success, or NonZeroExitCode with an
// ExitCode cause, which client-go's executor returns as an exit error),
// or why the output stopped.
func (s *Server) endAttach(ctx context.Context, sess *terminalSession, st *attachStreams, outErr error) {
	var status metav1.Status
	if outErr != nil {
		status = apierrors.NewInternalError(fmt.Errorf("the terminal's output of BashTask %s/%s stopped: %w", sess.task.Namespace, sess.task.Name, outErr)).ErrStatus
	} else {
		status = exitStatus(s.awaitExit(ctx, sess.task))
	}
	if b, err := json.Marshal(status); err == nil {
		_, _ = st.errors.Write(b)
	}
}

// awaitExit reads the ended task until its status has its exit code, at
// most attachExitWait; nil when it did not come.
func (s *Server) awaitExit(ctx context.Context, task *bashtaskv1alpha1.BashTask) *bashtaskv1alpha1.BashTask {
	wctx, cancel := context.WithTimeout(ctx, attachExitWait)
	defer cancel()
	for {
		t, err := s.refetchLive(wctx, task)
		if err == nil && finished(t) {
			return t
		}
		if errors.Is(err, errTaskGone) || s.waitRetry(wctx, task, agentRetryInterval) != nil {
			return nil
		}
	}
}

// exitStatus is the error channel's Status for an ended task (nil: its
// status did not say).
func exitStatus(t *bashtaskv1alpha1.BashTask) metav1.Status {
	if t == nil || t.Status.ExitCode == nil {
		return metav1.Status{Status: metav1.StatusFailure, Reason: metav1.StatusReasonInternalError, Message: "the task ended; its exit code is not known yet"}
	}
	code := *t.Status.ExitCode
	if code == 0 {
		return metav1.Status{Status: metav1.StatusSuccess}
	}
	return metav1.Status{
		Status: metav1.StatusFailure, Reason: "NonZeroExitCode",
		Message: fmt.Sprintf("command terminated with non-zero exit code: %d (%s)", code, *t.Status.Reason),
		Details: &metav1.StatusDetails{Causes: []metav1.StatusCause{{Type: "ExitCode", Message: strconv.Itoa(int(code))}}},
	}
}
