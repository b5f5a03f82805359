package agent

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	agentv1 "github.com/bashtask/bashtask-operator/api/agent/v1"
)

// readOutput is one ReadOutput call's result.
type readOutput struct {
	header, end *agentv1.OutputState
	data        []byte
	err         error // the stream's status; nil when it ended with end set
}

// collect reads a ReadOutput stream to its end, checking that the header
// comes first, that every chunk starts where the previous one ended, and
// that nothing follows the end message.
func collect(t *testing.T, stream agentv1.Executor_ReadOutputClient, offset int64, header *agentv1.OutputState) readOutput {
	t.Helper()
	out := readOutput{header: header}
	next := offset
	for {
		m, err := stream.Recv()
		if err != nil {
			if !errors.Is(err, io.EOF) {
				out.err = err
			} else if out.end == nil {
				t.Fatal("stream ended without an end message")
			}
			return out
		}
		switch {
		case m.GetHeader() != nil:
			if out.header != nil || len(out.data) > 0 {
				t.Fatal("header after the first message")
			}
			out.header = m.GetHeader()
		case m.GetEnd() != nil:
			out.end = m.GetEnd()
		default:
			if out.header == nil {
				t.Fatal("data before the header")
			}
			if out.end != nil {
				t.Fatal("data after the end message")
			}
			if m.GetOffset() != next {
				t.Fatalf("chunk at offset %d, want %d", m.GetOffset(), next)
			}
			out.data = append(out.data, m.GetData()...)
			next += int64(len(m.GetData()))
		}
	}
}

func (r *rig) readOutput(ctx context.Context, req *agentv1.ReadOutputRequest) readOutput {
	r.t.Helper()
	stream, err := r.client.ReadOutput(ctx, req)
	if err != nil {
		r.t.Fatal(err)
	}
	return collect(r.t, stream, req.GetOffset(), nil)
}

func TestReadOutputFollowAndOffsets(t *testing.T) {
	r := newRig(t)
	_, next := r.watch()
	fifo := filepath.Join(r.dir, "go-on")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	first, second := "héllo ", strings.Repeat("wörld ", 300000) // 2.1 MB: several chunks
	cmd := `printf '%s' "$1" >&2; printf 'héllo '; read x < ` + fifo + `; for i in $(seq 300000); do printf 'wörld '; done`
	spec := taskSpec("uid-out", cmd)
	spec.Command = `set -- err; ` + cmd
	if _, err := r.client.Start(t.Context(), &agentv1.StartRequest{Spec: spec}); err != nil {
		t.Fatal(err)
	}

	// Follow from 0: the first bytes arrive while the command waits on
	// the fifo, so they came from the running task, not the ended one.
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	stream, err := r.client.ReadOutput(ctx, &agentv1.ReadOutputRequest{Uid: "uid-out", Follow: true})
	if err != nil {
		t.Fatal(err)
	}
	var got []byte
	var header *agentv1.OutputState
	for len(got) < len(first) {
		m, err := stream.Recv()
		if err != nil {
			t.Fatalf("before the fifo was opened: %v", err)
		}
		if h := m.GetHeader(); h != nil {
			if h.GetComplete() {
				t.Fatal("header says complete while the task runs")
			}
			header = h
		}
		got = append(got, m.GetData()...)
	}
	if string(got) != first {
		t.Fatalf("first bytes %q, want %q", got, first)
	}
	// Open the fifo for writing; the command's read then sees EOF.
	f, err := os.OpenFile(fifo, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.Close()
	rest := collect(t, stream, int64(len(first)), header)
	if rest.err != nil {
		t.Fatal(rest.err)
	}
	want := first + second
	if string(got)+string(rest.data) != want {
		t.Fatalf("followed %d bytes, want %d", len(got)+len(rest.data), len(want))
	}
	if !rest.end.GetComplete() || rest.end.GetTotalBytes() != int64(len(want)) {
		t.Errorf("end %v, want complete with %d bytes", rest.end, len(want))
	}
	until(t, next, agentv1.EventType_EVENT_TYPE_FINISHED)

	// From the middle of é (offset 2 splits its two bytes), ended task.
	o := r.readOutput(ctx, &agentv1.ReadOutputRequest{Uid: "uid-out", Offset: 2})
	if o.err != nil || !bytes.Equal(o.data, []byte(want)[2:]) {
		t.Fatalf("offset 2: %d bytes, %v; want %d bytes", len(o.data), o.err, len(want)-2)
	}
	if !o.header.GetComplete() || o.header.GetTotalBytes() != int64(len(want)) {
		t.Errorf("header %v, want complete with %d bytes", o.header, len(want))
	}
	// limit_bytes.
	o = r.readOutput(ctx, &agentv1.ReadOutputRequest{Uid: "uid-out", Offset: 1, LimitBytes: 5})
	if o.err != nil || string(o.data) != want[1:6] {
		t.Errorf("offset 1, limit 5: %q, %v", o.data, o.err)
	}
	// At the end: no data, end complete; with follow too (the task ended).
	o = r.readOutput(ctx, &agentv1.ReadOutputRequest{Uid: "uid-out", Offset: int64(len(want)), Follow: true})
	if o.err != nil || len(o.data) != 0 || !o.end.GetComplete() {
		t.Errorf("at the end: %q, %v, %v", o.data, o.end, o.err)
	}
	// Past the end.
	o = r.readOutput(ctx, &agentv1.ReadOutputRequest{Uid: "uid-out", Offset: int64(len(want)) + 1})
	if status.Code(o.err) != codes.OutOfRange || !strings.Contains(o.err.Error(), "offset 2100008") {
		t.Errorf("past the end: %v, want OutOfRange naming the offset", o.err)
	}
	// stderr.
	o = r.readOutput(ctx, &agentv1.ReadOutputRequest{Uid: "uid-out", Stream: agentv1.OutputStream_OUTPUT_STREAM_STDERR})
	if o.err != nil || string(o.data) != "err" {
		t.Errorf("stderr: %q, %v", o.data, o.err)
	}
	// Unknown UID.
	o = r.readOutput(ctx, &agentv1.ReadOutputRequest{Uid: "nobody"})
	if status.Code(o.err) != codes.NotFound {
		t.Errorf("unknown uid: %v, want NotFound", o.err)
	}
}

func TestReadOutputPastSpillLimit(t *testing.T) {
	r := newRig(t)
	_, next := r.watch()
	spec := taskSpec("uid-spill", `printf '0123456789abcdefghij'`)
	spec.Output = &agentv1.OutputSettings{SpillLimitBytes: 10}
	if _, err := r.client.Start(t.Context(), &agentv1.StartRequest{Spec: spec}); err != nil {
		t.Fatal(err)
	}
	until(t, next, agentv1.EventType_EVENT_TYPE_FINISHED)
	ctx := t.Context()
	// The kept bytes, then the error naming where they stop.
	o := r.readOutput(ctx, &agentv1.ReadOutputRequest{Uid: "uid-spill", Offset: 4})
	if string(o.data) != "456789" || status.Code(o.err) != codes.DataLoss || !strings.Contains(o.err.Error(), "offset 10") ||
		!strings.Contains(o.err.Error(), "spillLimitBytes 10") {
		t.Errorf("from 4: %q, %v; want 456789 then DataLoss at offset 10", o.data, o.err)
	}
	// Known at the start: the error comes before any message.
	o = r.readOutput(ctx, &agentv1.ReadOutputRequest{Uid: "uid-spill", Offset: 12, Follow: true})
	if o.header != nil || status.Code(o.err) != codes.DataLoss || !strings.Contains(o.err.Error(), "offset 12") {
		t.Errorf("from 12: header %v, %v; want DataLoss naming offset 12 first", o.header, o.err)
	}
}

func TestReadOutputRunningWithoutFollow(t *testing.T) {
	r := newRig(t)
	fifo := filepath.Join(r.dir, "stop")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := r.client.Start(t.Context(), &agentv1.StartRequest{Spec: taskSpec("uid-run", `printf abc; read x < `+fifo)}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if f, err := os.OpenFile(fifo, os.O_WRONLY, 0); err == nil {
			f.Close()
		}
	})
	ctx := t.Context()
	// Follow with a limit waits until the bytes are there.
	if o := r.readOutput(ctx, &agentv1.ReadOutputRequest{Uid: "uid-run", Follow: true, LimitBytes: 3}); o.err != nil || string(o.data) != "abc" {
		t.Fatalf("follow, limit 3: %q, %v", o.data, o.err)
	}
	o := r.readOutput(ctx, &agentv1.ReadOutputRequest{Uid: "uid-run"})
	if o.err != nil || string(o.data) != "abc" || o.header.GetComplete() || o.end.GetComplete() || o.end.GetTotalBytes() != 3 {
		t.Fatalf("without follow: %q, header %v, end %v, %v; want abc, not complete", o.data, o.header, o.end, o.err)
	}
	// An offset past the bytes known of a running stream waits with
	// follow; without it the answer is empty.
	o = r.readOutput(ctx, &agentv1.ReadOutputRequest{Uid: "uid-run", Offset: 10})
	if o.err != nil || len(o.data) != 0 || o.end.GetComplete() {
		t.Errorf("offset 10 of a running task: %q, %v, %v", o.data, o.end, o.err)
	}
}
