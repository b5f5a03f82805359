package agent

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	agentv1 "github.com/bashtask/bashtask-operator/api/agent/v1"
	"github.com/bashtask/bashtask-operator/internal/outputorder"
)

// demuxLines splits a framed stream into "out:" and "err:" lines; it fails
// on a frame cut short.
func demuxLines(t *testing.T, framed []byte) []string {
	t.Helper()
	var out []string
	for len(framed) > 0 {
		if len(framed) < 8 {
			t.Fatalf("%d bytes left, a header is 8", len(framed))
		}
		n := int(binary.BigEndian.Uint32(framed[4:8]))
		tag := map[byte]string{1: "out:", 2: "err:"}[framed[0]]
		if tag == "" || len(framed) < 8+n {
			t.Fatalf("bad frame %v with %d bytes left", framed[:8], len(framed)-8)
		}
		for _, l := range strings.SplitAfter(string(framed[8:8+n]), "\n") {
			if l != "" {
				out = append(out, tag+strings.TrimSuffix(l, "\n"))
			}
		}
		framed = framed[8+n:]
	}
	return out
}

func (r *rig) readCombined(ctx context.Context, req *agentv1.ReadCombinedOutputRequest) readOutput {
	r.t.Helper()
	stream, err := r.client.ReadCombinedOutput(ctx, req)
	if err != nil {
		r.t.Fatal(err)
	}
	return collect(r.t, stream, req.GetOffset(), nil)
}

const interleaved = `for i in 1 2 3 4 5; do echo out$i; sleep 0.1; echo err$i >&2; sleep 0.1; done`

func interleavedLines() string {
	var want []string
	for i := 1; i <= 5; i++ {
		want = append(want, fmt.Sprintf("out:out%d", i), fmt.Sprintf("err:err%d", i))
	}
	return strings.Join(want, " ")
}

// TestReadCombinedOutput: a follower of the running task gets both
// streams in the order the command wrote them, framed; the ended task
// serves the same bytes from every offset, also inside a header, and
// within limit_bytes; past the end is OUT_OF_RANGE.
func TestReadCombinedOutput(t *testing.T) {
	r := newRig(t)
	_, next := r.watch()
	fifo := filepath.Join(r.dir, "go-on")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := `echo first; read x < ` + fifo + `; ` + interleaved
	if _, err := r.client.Start(t.Context(), &agentv1.StartRequest{Spec: taskSpec("uid-all", cmd)}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	stream, err := r.client.ReadCombinedOutput(ctx, &agentv1.ReadCombinedOutputRequest{Uid: "uid-all", Follow: true})
	if err != nil {
		t.Fatal(err)
	}
	// The first frame arrives while the command waits on the fifo: the
	// run being read is framed for the follower at once.
	var got []byte
	for len(got) < 8+6 {
		m, err := stream.Recv()
		if err != nil {
			t.Fatalf("before the fifo was opened: %v", err)
		}
		if h := m.GetHeader(); h != nil && h.GetComplete() {
			t.Fatal("header says complete while the task runs")
		}
		got = append(got, m.GetData()...)
	}
	if want := append([]byte{1, 0, 0, 0, 0, 0, 0, 6}, "first\n"...); !bytes.Equal(got, want) {
		t.Fatalf("first frame %q, want %q", got, want)
	}
	if err := os.WriteFile(fifo, []byte("go\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	rest := collect(t, stream, int64(len(got)), &agentv1.OutputState{})
	if rest.err != nil || !rest.end.GetComplete() {
		t.Fatalf("follow: %v, end %v", rest.err, rest.end)
	}
	followed := slices.Concat(got, rest.data)
	if got := strings.Join(demuxLines(t, followed), " "); got != "out:first "+interleavedLines() {
		t.Fatalf("followed %q, want the command's order", got)
	}
	until(t, next, agentv1.EventType_EVENT_TYPE_FINISHED)

	whole := r.readCombined(ctx, &agentv1.ReadCombinedOutputRequest{Uid: "uid-all"})
	if whole.err != nil || !bytes.Equal(whole.data, followed) || whole.header.GetTotalBytes() != int64(len(followed)) || !whole.end.GetComplete() {
		t.Fatalf("after the end: %d bytes, %v, header %v; want the %d followed", len(whole.data), whole.err, whole.header, len(followed))
	}
	for _, off := range []int64{3, 8, 15, int64(len(followed)) - 1, int64(len(followed))} {
		o := r.readCombined(ctx, &agentv1.ReadCombinedOutputRequest{Uid: "uid-all", Offset: off, Follow: true})
		if o.err != nil || !bytes.Equal(o.data, followed[off:]) {
			t.Errorf("from %d: %q, %v; want %q", off, o.data, o.err, followed[off:])
		}
	}
	if o := r.readCombined(ctx, &agentv1.ReadCombinedOutputRequest{Uid: "uid-all", Offset: 3, LimitBytes: 10}); o.err != nil || !bytes.Equal(o.data, followed[3:13]) {
		t.Errorf("limit 10 from 3: %q, %v", o.data, o.err)
	}
	o := r.readCombined(ctx, &agentv1.ReadCombinedOutputRequest{Uid: "uid-all", Offset: int64(len(followed)) + 1})
	if status.Code(o.err) != codes.OutOfRange {
		t.Errorf("past the end: %v, want OutOfRange", o.err)
	}
}

// TestOrderJournalUploaded: a forgotten task's order journal is in the
// bucket beside its streams, served by ReadOutput by its key, and framing
// the three objects gives what the agent served while it held the task.
func TestOrderJournalUploaded(t *testing.T) {
	bucketDir := t.TempDir()
	r := newRig(t, func(c *Config) { c.BucketURL = "file://" + bucketDir + "?no_tmp_dir=true" })
	_, next := r.watch()
	ctx := t.Context()
	spec := taskSpec("uid-ord", interleaved)
	spec.Output = &agentv1.OutputSettings{Upload: agentv1.UploadPolicy_UPLOAD_POLICY_WHEN_INCOMPLETE}
	if _, err := r.client.Start(ctx, &agentv1.StartRequest{Spec: spec}); err != nil {
		t.Fatal(err)
	}
	until(t, next, agentv1.EventType_EVENT_TYPE_FINISHED)
	held := r.readCombined(ctx, &agentv1.ReadCombinedOutputRequest{Uid: "uid-ord"})
	if held.err != nil || strings.Join(demuxLines(t, held.data), " ") != interleavedLines() {
		t.Fatalf("held: %v, %q", held.err, demuxLines(t, held.data))
	}
	// The tails hold both streams, so only the journal is uploaded.
	if _, err := r.client.Forget(ctx, &agentv1.ForgetRequest{Uid: "uid-ord"}); err != nil {
		t.Fatal(err)
	}
	until(t, next, agentv1.EventType_EVENT_TYPE_FORGOTTEN)
	o := r.readOutput(ctx, &agentv1.ReadOutputRequest{Uid: "uid-ord", Stream: agentv1.OutputStream_OUTPUT_STREAM_ORDER, ObjectKey: "ns/task-uid-ord/uid-ord/order"})
	if o.err != nil {
		t.Fatal(o.err)
	}
	recs, err := outputorder.Parse(o.data)
	if err != nil || len(recs) != 9 {
		t.Fatalf("journal %v: %v, %v; want 9 records (the last run is the rest)", o.data, recs, err)
	}
	var p outputorder.Parser
	_ = p.Feed(o.data, func(outputorder.Record) error { return nil })
	recs = append(recs, outputorder.Rest(p.Sums, [3]int64{0, 25, 25})...)
	streams := [3][]byte{nil, []byte("out1\nout2\nout3\nout4\nout5\n"), []byte("err1\nerr2\nerr3\nerr4\nerr5\n")}
	var framed []byte
	var c outputorder.Cursor
	for _, rec := range recs {
		_ = c.Walk(rec, 0, func(pc outputorder.Piece) error {
			if len(pc.Header) > 0 {
				framed = append(framed, pc.Header...)
			} else {
				framed = append(framed, streams[pc.Stream][pc.Offset:pc.Offset+pc.Len]...)
			}
			return nil
		})
	}
	if !bytes.Equal(framed, held.data) {
		t.Fatalf("framed from the bucket %q, the agent served %q", framed, held.data)
	}
	if o := r.readOutput(ctx, &agentv1.ReadOutputRequest{Uid: "uid-ord", Stream: agentv1.OutputStream_OUTPUT_STREAM_ORDER}); status.Code(o.err) != codes.InvalidArgument {
		t.Errorf("the order journal without a key: %v, want InvalidArgument", o.err)
	}
}

// TestReadCombinedOutputAfterRestart: the next incarnation frames a task
// an earlier one ran from its journal and spill files, with the same
// bytes as before.
func TestReadCombinedOutputAfterRestart(t *testing.T) {
	stateDir := filepath.Join(t.TempDir(), "state")
	first := newRig(t, func(c *Config) { c.StateDir = stateDir })
	_, next := first.watch()
	spec := taskSpec("uid-again", interleaved)
	spec.Output = &agentv1.OutputSettings{Upload: agentv1.UploadPolicy_UPLOAD_POLICY_NEVER}
	if _, err := first.client.Start(t.Context(), &agentv1.StartRequest{Spec: spec}); err != nil {
		t.Fatal(err)
	}
	until(t, next, agentv1.EventType_EVENT_TYPE_FINISHED)
	before := first.readCombined(t.Context(), &agentv1.ReadCombinedOutputRequest{Uid: "uid-again"})
	if before.err != nil || strings.Join(demuxLines(t, before.data), " ") != interleavedLines() {
		t.Fatalf("before the restart: %v, %q", before.err, demuxLines(t, before.data))
	}
	if err := first.shutdown(); err != nil {
		t.Fatal(err)
	}
	r := newRig(t, func(c *Config) { c.StateDir = stateDir })
	for _, off := range []int64{0, 5, 13} {
		o := r.readCombined(t.Context(), &agentv1.ReadCombinedOutputRequest{Uid: "uid-again", Offset: off, Follow: true})
		if o.err != nil || !bytes.Equal(o.data, before.data[off:]) || !o.end.GetComplete() {
			t.Errorf("after the restart, from %d: %q, %v; want %q", off, o.data, o.err, before.data[off:])
		}
	}
}

// TestReadCombinedOutputPastSpillLimit: the framed stream stops at the
// first byte a spill file does not hold, with DATA_LOSS naming that
// framed offset, after every byte before it; an offset past it is
// DATA_LOSS at once.
func TestReadCombinedOutputPastSpillLimit(t *testing.T) {
	r := newRig(t)
	_, next := r.watch()
	spec := taskSpec("uid-cut", `echo e >&2; sleep 0.1; printf 0123456789abcdef; sleep 0.1; echo f >&2`)
	spec.Output = &agentv1.OutputSettings{SpillLimitBytes: 10}
	if _, err := r.client.Start(t.Context(), &agentv1.StartRequest{Spec: spec}); err != nil {
		t.Fatal(err)
	}
	until(t, next, agentv1.EventType_EVENT_TYPE_FINISHED)
	o := r.readCombined(t.Context(), &agentv1.ReadCombinedOutputRequest{Uid: "uid-cut"})
	want := append([]byte{2, 0, 0, 0, 0, 0, 0, 2}, "e\n"...)
	want = append(want, 1, 0, 0, 0, 0, 0, 0, 16)
	want = append(want, "0123456789"...)
	if !bytes.Equal(o.data, want) || status.Code(o.err) != codes.DataLoss || !strings.Contains(o.err.Error(), "offset 28") {
		t.Fatalf("got %q, %v; want %q and DATA_LOSS at offset 28", o.data, o.err, want)
	}
	o = r.readCombined(t.Context(), &agentv1.ReadCombinedOutputRequest{Uid: "uid-cut", Offset: 30})
	if len(o.data) != 0 || status.Code(o.err) != codes.DataLoss || !strings.Contains(o.err.Error(), "offset 30") {
		t.Fatalf("from 30: %q, %v; want DATA_LOSS at offset 30", o.data, o.err)
	}
}
