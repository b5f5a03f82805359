package v1alpha1

// Resources of the API: the parent resource and its two subresources, as
// RBAC names them (get on bashtasks/log, create on bashtasks/stdin in the
// group output.bashtask.dev).
const (
	// Resource is the parent resource, the view of a bashtask.dev BashTask.
	Resource = "bashtasks"
	// SubresourceLog streams a task's stdout, stderr or both framed (GET).
	SubresourceLog = "log"
	// SubresourceStdin takes a task's streamed standard input (POST).
	SubresourceStdin = "stdin"
)

// Values of LogOptions.Stream (the query parameter stream).
const (
	// StreamStdout is the command's standard output, the default.
	StreamStdout = "stdout"
	// StreamStderr is the command's standard error.
	StreamStderr = "stderr"
	// StreamAll is both streams in one, in the order the agent read them,
	// framed as Docker's multiplexed attach stream (docs/output.md,
	// "stdout and stderr in one stream"): offsets, sizes and limits count
	// bytes of the framed stream, headers included.
	StreamAll = "all"
)

// The framing of StreamAll: each frame is a header of FrameHeaderBytes, the
// stream (FrameStdout or FrameStderr), three zero bytes and the payload's
// length as a big-endian uint32, then the payload, at most
// FramePayloadMaxBytes.
const (
	// FrameHeaderBytes is the size of a frame's header, 8 bytes.
	FrameHeaderBytes = 8
	// FrameStdout marks a frame of the command's standard output.
	FrameStdout = 1
	// FrameStderr marks a frame of the command's standard error.
	FrameStderr = 2
	// FramePayloadMaxBytes is the most bytes one frame carries, 1 MiB.
	FramePayloadMaxBytes = 1 << 20
)

// Query parameters of bashtasks/log and bashtasks/stdin: the JSON names of
// LogOptions' and StdinOptions' fields.
const (
	// ParamStream is LogOptions.Stream.
	ParamStream = "stream"
	// ParamOffset is LogOptions.Offset and StdinOptions.Offset, in bytes.
	ParamOffset = "offset"
	// ParamLimitBytes is LogOptions.LimitBytes, in bytes.
	ParamLimitBytes = "limitBytes"
	// ParamFollow is LogOptions.Follow, true or false.
	ParamFollow = "follow"
	// ParamUID is LogOptions.UID, a task's metadata.uid.
	ParamUID = "uid"
	// ParamClose is StdinOptions.Close, true or false.
	ParamClose = "close"
)

// Response headers and trailers of bashtasks/log (docs/output.md).
const (
	// HeaderOffset is the offset, in bytes from the stream's start, of the
	// body's first byte.
	HeaderOffset = "Bashtask-Stream-Offset"
	// HeaderTotal is how many bytes of the stream were known when the
	// response started.
	HeaderTotal = "Bashtask-Stream-Total"
	// HeaderComplete is "true" when the task had ended when the response
	// started, so HeaderTotal is final.
	HeaderComplete = "Bashtask-Stream-Complete"
	// HeaderTaskUID is the task's metadata.uid, in the responses of
	// bashtasks/log and bashtasks/stdin: a client that sees it change
	// talks to a task re-created under the same name.
	HeaderTaskUID = "Bashtask-Task-Uid"
	// TrailerEndOffset is the offset, in bytes, after the body's last
	// byte, sent when a response ends early because bytes cannot be
	// served.
	TrailerEndOffset = "Bashtask-Stream-End-Offset"
	// TrailerError says why a response ended early, naming the offset.
	TrailerError = "Bashtask-Stream-Error"
)

// Response headers of bashtasks/stdin (docs/stdin.md).
const (
	// HeaderStdinOffset is the bytes of input accepted after the request:
	// the offset of the next byte to send.
	HeaderStdinOffset = "Bashtask-Stdin-Offset"
	// HeaderStdinClosed is "true" once the input accepts no more bytes.
	HeaderStdinClosed = "Bashtask-Stdin-Closed"
	// HeaderStdinReason says why the input is closed: StdinReasonClosed,
	// StdinReasonIdleTimeout or StdinReasonProcessExited.
	HeaderStdinReason = "Bashtask-Stdin-Reason"
)

// Reasons of a closed input (HeaderStdinReason).
const (
	// StdinReasonClosed is an input a client closed (close=true).
	StdinReasonClosed = "Closed"
	// StdinReasonIdleTimeout is an input closed because no request came
	// for the task's spec.stdinStream.idleTimeoutSeconds.
	StdinReasonIdleTimeout = "IdleTimeout"
	// StdinReasonProcessExited is an input closed because the command
	// closed its standard input or exited before a client closed it.
	StdinReasonProcessExited = "ProcessExited"
)

// StdinRequestBytes is the most bytes the body of one bashtasks/stdin
// request carries, 4 MiB: the agent's limit on one write of input (its
// WriteStdin request, api/agent/v1 MaxStdinWriteBytes), so that a request
// is one write. A larger body is refused with 413 Request Entity Too
// Large; a client splits larger input into several requests.
const StdinRequestBytes = 4 << 20
