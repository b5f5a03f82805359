//go:build linux

package agent

import (
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	agentv1 "github.com/bashtask/bashtask-operator/api/agent/v1"
)

// stdinDetail is the StdinState an error of WriteStdin carries.
func stdinDetail(err error) *agentv1.StdinState {
	for _, d := range status.Convert(err).Details() {
		if st, ok := d.(*agentv1.StdinState); ok {
			return st
		}
	}
	return nil
}

// WriteStdin feeds a streamed task exactly once by offset and answers
// each refusal with its code: NOT_FOUND, FAILED_PRECONDITION (not
// streamed, ended), OUT_OF_RANGE (a gap), ABORTED (closed).
func TestWriteStdin(t *testing.T) {
	r := newRig(t)
	write := func(uid string, offset int64, data string, closeAfter bool) (*agentv1.StdinState, error) {
		resp, err := r.client.WriteStdin(t.Context(), &agentv1.WriteStdinRequest{Uid: uid, Offset: offset, Data: []byte(data), Close: closeAfter})
		return resp.GetState(), err
	}
	if _, err := write("uid-none", 0, "x", false); status.Code(err) != codes.NotFound {
		t.Fatalf("unknown uid: %v", err)
	}
	spec := taskSpec("uid-in", `cat; echo "[eof]"`)
	spec.StdinStream = &agentv1.StdinStream{IdleTimeout: durationpb.New(time.Minute)}
	if _, err := r.client.Start(t.Context(), &agentv1.StartRequest{Spec: spec}); err != nil {
		t.Fatal(err)
	}
	if st, err := write("uid-in", 0, "one ", false); err != nil || st.GetAcceptedBytes() != 4 {
		t.Fatalf("first write: %v %v", st, err)
	}
	_, err := write("uid-in", 7, "x", false)
	if status.Code(err) != codes.OutOfRange || stdinDetail(err).GetAcceptedBytes() != 4 {
		t.Fatalf("a gap: %v (detail %v)", err, stdinDetail(err))
	}
	if st, err := write("uid-in", 2, "e two\n", true); err != nil || st.GetAcceptedBytes() != 8 || !st.GetClosed() ||
		st.GetReason() != agentv1.StdinCloseReason_STDIN_CLOSE_REASON_CLOSED {
		t.Fatalf("overlapping resend with close: %v %v", st, err)
	}
	_, err = write("uid-in", 8, "more", false)
	if c := status.Code(err); c != codes.Aborted && c != codes.FailedPrecondition {
		t.Fatalf("after the close: %v", err)
	}
	st := r.finished("uid-in")
	if st.GetStdout().GetTail() != "one two\n[eof]\n" {
		t.Fatalf("stdout %q (%s)", st.GetStdout().GetTail(), st.GetMessage())
	}
	if in := st.GetStdin(); in.GetAcceptedBytes() != 8 || !in.GetClosed() || in.GetReason() != agentv1.StdinCloseReason_STDIN_CLOSE_REASON_CLOSED || !in.GetTaskFinished() {
		t.Fatalf("status stdin %v", in)
	}
	_, err = write("uid-in", 8, "more", false)
	if status.Code(err) != codes.FailedPrecondition || !stdinDetail(err).GetTaskFinished() {
		t.Fatalf("after the end: %v (detail %v)", err, stdinDetail(err))
	}

	r.runTask(taskSpec("uid-plain", "true"))
	if _, err := write("uid-plain", 0, "x", false); status.Code(err) != codes.FailedPrecondition || stdinDetail(err) != nil {
		t.Fatalf("not streamed: %v", err)
	}
}
