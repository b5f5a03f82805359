//go:build linux

package agent

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	agentv1 "github.com/bashtask/bashtask-operator/api/agent/v1"
	"github.com/bashtask/bashtask-operator/internal/tlsutil"
)

// screen follows a task's stdout from an offset, as a client of the
// terminal reads it.
type screen struct {
	mu  sync.Mutex
	out strings.Builder
}

func (r *rig) follow(ctx context.Context, uid string, offset int64) *screen {
	r.t.Helper()
	stream, err := r.client.ReadOutput(ctx, &agentv1.ReadOutputRequest{Uid: uid, Offset: offset, Follow: true})
	if err != nil {
		r.t.Fatal(err)
	}
	s := &screen{}
	go func() {
		for {
			m, err := stream.Recv()
			if err != nil {
				return
			}
			s.mu.Lock()
			s.out.Write(m.GetData())
			s.mu.Unlock()
		}
	}()
	return s
}

// wait waits until the screen shows want.
func (s *screen) wait(t *testing.T, want string) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		s.mu.Lock()
		got := s.out.String()
		s.mu.Unlock()
		if strings.Contains(got, want) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %q; the screen shows %q", want, got)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// attach opens an attach session on uid with the first message first and
// returns the stream and the attached event, or the call's error.
func attach(ctx context.Context, tc agentv1.TerminalClient, first *agentv1.TerminalInput) (agentv1.Terminal_AttachClient, *agentv1.TerminalAttached, error) {
	stream, err := tc.Attach(ctx)
	if err != nil {
		return nil, nil, err
	}
	if err := stream.Send(first); err != nil {
		_, err = stream.Recv() // the agent's refusal
		return nil, nil, err
	}
	ev, err := stream.Recv()
	if err != nil {
		return nil, nil, err
	}
	return stream, ev.GetAttached(), nil
}

func ttySpec(uid string) *agentv1.TaskSpec {
	spec := taskSpec(uid, "exec env PS1='$ ' bash --norc --noprofile -i")
	spec.Tty = true
	return spec
}

// An attach session types into the terminal and sizes it; a client that
// goes away leaves the task running; a second attach replays the recent
// screen and carries on; the task's end closes the session.
func TestTerminalAttachDetachReattach(t *testing.T) {
	r := newRig(t)
	tc := agentv1.NewTerminalClient(r.dial(r.ca, tlsutil.LeafOptions{CommonName: "bashtask-controller", Client: true}))
	if _, err := r.client.Start(t.Context(), &agentv1.StartRequest{Spec: ttySpec("uid-tty")}); err != nil {
		t.Fatal(err)
	}
	ctx1, detach := context.WithCancel(t.Context())
	s1, at, err := attach(ctx1, tc, &agentv1.TerminalInput{Uid: "uid-tty", Resize: &agentv1.WindowSize{Rows: 30, Cols: 100}})
	if err != nil {
		t.Fatal(err)
	}
	scr := r.follow(ctx1, "uid-tty", at.GetReplayOffset())
	if err := s1.Send(&agentv1.TerminalInput{Data: []byte("echo size=$(tput cols)x$(tput lines)\r")}); err != nil {
		t.Fatal(err)
	}
	scr.wait(t, "size=100x30")
	detach()
	time.Sleep(100 * time.Millisecond)
	if resp, err := r.client.Get(t.Context(), &agentv1.GetRequest{Uid: "uid-tty"}); err != nil || resp.GetStatus().GetState() != agentv1.TaskState_TASK_STATE_RUNNING {
		t.Fatalf("after the client went away: %v %v", resp.GetStatus(), err)
	}

	s2, at2, err := attach(t.Context(), tc, &agentv1.TerminalInput{Uid: "uid-tty"})
	if err != nil {
		t.Fatal(err)
	}
	scr2 := r.follow(t.Context(), "uid-tty", at2.GetReplayOffset())
	scr2.wait(t, "size=100x30") // the recent screen
	if err := s2.Send(&agentv1.TerminalInput{Data: []byte("exit 7\r")}); err != nil {
		t.Fatal(err)
	}
	ev, err := s2.Recv()
	if err != nil || !ev.GetClosed() {
		t.Fatalf("at the task's end: %v %v, want closed", ev, err)
	}
	if st := r.finished("uid-tty"); st.GetExitCode() != 7 {
		t.Fatalf("exit code %d, want 7 (%s)", st.GetExitCode(), st.GetMessage())
	}
	if _, _, err := attach(t.Context(), tc, &agentv1.TerminalInput{Uid: "uid-tty"}); status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "has ended") {
		t.Fatalf("attach to an ended task: %v, want FAILED_PRECONDITION naming the end", err)
	}
}

// Attach refuses, each with its code and a message that names it: an
// unknown task, one without a terminal, a bad message, and a session
// past MaxTerminalSessions.
func TestTerminalAttachRefusals(t *testing.T) {
	r := newRig(t)
	tc := agentv1.NewTerminalClient(r.dial(r.ca, tlsutil.LeafOptions{CommonName: "bashtask-controller", Client: true}))
	if _, _, err := attach(t.Context(), tc, &agentv1.TerminalInput{Uid: "uid-none"}); status.Code(err) != codes.NotFound {
		t.Errorf("unknown task: %v", err)
	}
	plain := taskSpec("uid-plain", "sleep 60")
	if _, err := r.client.Start(t.Context(), &agentv1.StartRequest{Spec: plain}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := attach(t.Context(), tc, &agentv1.TerminalInput{Uid: "uid-plain"}); status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "spec.tty") {
		t.Errorf("a task without a terminal: %v, want FAILED_PRECONDITION naming spec.tty", err)
	}
	if _, err := r.client.Start(t.Context(), &agentv1.StartRequest{Spec: ttySpec("uid-tty")}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := attach(t.Context(), tc, &agentv1.TerminalInput{Uid: "uid-tty", Resize: &agentv1.WindowSize{Rows: 0, Cols: 80}}); status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "resize") {
		t.Errorf("a zero size: %v, want INVALID_ARGUMENT naming resize", err)
	}
	big := &agentv1.TerminalInput{Uid: "uid-tty", Data: make([]byte, TerminalInputBytes+1)}
	if _, _, err := attach(t.Context(), tc, big); status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "TerminalInputBytes") {
		t.Errorf("too much input: %v, want INVALID_ARGUMENT naming TerminalInputBytes", err)
	}
	for i := range MaxTerminalSessions {
		if _, _, err := attach(t.Context(), tc, &agentv1.TerminalInput{Uid: "uid-tty"}); err != nil {
			t.Fatalf("session %d: %v", i+1, err)
		}
	}
	if _, _, err := attach(t.Context(), tc, &agentv1.TerminalInput{Uid: "uid-tty"}); status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "MaxTerminalSessions") {
		t.Errorf("one session too many: %v, want RESOURCE_EXHAUSTED naming MaxTerminalSessions", err)
	}
}
