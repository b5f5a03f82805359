package agent

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/testing/protocmp"

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

// forgetUploaded runs spec with every stream uploaded to the rig's bucket,
// has the agent forget it once the uploads are done, and returns its
// final status.
func forgetUploaded(t *testing.T, r *rig, next func() *agentv1.TaskEvent, spec *agentv1.TaskSpec) *agentv1.TaskStatus {
	t.Helper()
	if spec.Output == nil {
		spec.Output = &agentv1.OutputSettings{}
	}
	spec.Output.Upload = agentv1.UploadPolicy_UPLOAD_POLICY_ALWAYS
	if _, err := r.client.Start(t.Context(), &agentv1.StartRequest{Spec: spec}); err != nil {
		t.Fatal(err)
	}
	until(t, next, agentv1.EventType_EVENT_TYPE_FINISHED)
	if _, err := r.client.Forget(t.Context(), &agentv1.ForgetRequest{Uid: spec.GetRef().GetUid()}); err != nil {
		t.Fatal(err)
	}
	var st *agentv1.TaskStatus
	for st == nil {
		switch ev := next(); ev.GetType() {
		case agentv1.EventType_EVENT_TYPE_UPLOADED:
			if ev.GetStatus().GetStdout().GetSpill().GetUploadState() == agentv1.UploadState_UPLOAD_STATE_UPLOADED {
				st = ev.GetStatus()
			}
		case agentv1.EventType_EVENT_TYPE_UPLOAD_FAILED:
			t.Fatalf("upload failed: %v", ev.GetStatus().GetStdout().GetSpill())
		}
	}
	until(t, next, agentv1.EventType_EVENT_TYPE_FORGOTTEN)
	if _, err := r.client.Get(t.Context(), &agentv1.GetRequest{Uid: spec.GetRef().GetUid()}); status.Code(err) != codes.NotFound {
		t.Fatalf("Get after the forget: %v, want NotFound", err)
	}
	return st
}

// TestReadOutputUploadedCopy: a forgotten task's uploaded streams are
// served from the agent's own bucket by their status's URL, in chunks,
// from any offset, with the errors of the spill file's reads; URLs of
// another bucket or key are refused before anything is read.
func TestReadOutputUploadedCopy(t *testing.T) {
	bucketDir := t.TempDir()
	r := newRig(t, func(c *Config) { c.BucketURL = "file://" + bucketDir + "?no_tmp_dir=true" })
	_, next := r.watch()
	ctx := t.Context()
	// 2.4 MB, three chunks, with a two-byte character split at offset 2.
	st := forgetUploaded(t, r, next, taskSpec("uid-obj", `printf 'é'; head -c 2400000 /dev/zero | tr '\0' x; printf err >&2`))
	out := st.GetStdout()
	url := out.GetSpill().GetUrl()
	if want := "file://" + bucketDir + "/ns/task-uid-obj/uid-obj/stdout"; url != want {
		t.Fatalf("spill url %q, want %q", url, want)
	}
	total := out.GetTotalBytes()

	o := r.readOutput(ctx, &agentv1.ReadOutputRequest{Uid: "uid-obj", ObjectUrl: url, Follow: true})
	if o.err != nil || int64(len(o.data)) != total || sha256hex(o.data) != out.GetSha256() {
		t.Fatalf("from 0: %d bytes, %v; want %d with sha256 %s", len(o.data), o.err, total, out.GetSha256())
	}
	wantState := &agentv1.OutputState{TotalBytes: total, Complete: true, SpillBytes: total}
	if diff := cmp.Diff(wantState, o.header, protocmp.Transform()); diff != "" {
		t.Errorf("header (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(wantState, o.end, protocmp.Transform()); diff != "" {
		t.Errorf("end (-want +got):\n%s", diff)
	}
	full := o.data
	if o = r.readOutput(ctx, &agentv1.ReadOutputRequest{Uid: "uid-obj", ObjectUrl: url, Offset: 1, LimitBytes: 1 << 20}); o.err != nil || !bytes.Equal(o.data, full[1:1+1<<20]) {
		t.Errorf("offset 1, limit 1 MiB: %d bytes, %v", len(o.data), o.err)
	}
	if o = r.readOutput(ctx, &agentv1.ReadOutputRequest{Uid: "uid-obj", ObjectUrl: url, Offset: total}); o.err != nil || len(o.data) != 0 || !o.end.GetComplete() {
		t.Errorf("at the end: %d bytes, %v, %v; want none and the end", len(o.data), o.end, o.err)
	}
	errURL := st.GetStderr().GetSpill().GetUrl()
	if o = r.readOutput(ctx, &agentv1.ReadOutputRequest{Uid: "uid-obj", ObjectUrl: errURL, Stream: agentv1.OutputStream_OUTPUT_STREAM_STDERR}); o.err != nil || string(o.data) != "err" {
		t.Errorf("stderr: %q, %v", o.data, o.err)
	}

	// A stream past its spill limit: the object holds its first 10 bytes.
	st = forgetUploaded(t, r, next, func() *agentv1.TaskSpec {
		s := taskSpec("uid-cut", `printf '0123456789abcdefghij'`)
		s.Output = &agentv1.OutputSettings{SpillLimitBytes: 10}
		return s
	}())
	cutURL := st.GetStdout().GetSpill().GetUrl()

	base := "file://" + bucketDir
	for name, tc := range map[string]struct {
		req      *agentv1.ReadOutputRequest
		wantData string
		code     codes.Code
		mention  string
	}{
		"past the end": {req: &agentv1.ReadOutputRequest{Uid: "uid-obj", ObjectUrl: url, Offset: total + 1},
			code: codes.OutOfRange, mention: fmt.Sprintf("offset %d", total+1)},
		"kept bytes, then the loss": {req: &agentv1.ReadOutputRequest{Uid: "uid-cut", ObjectUrl: cutURL, Offset: 4},
			wantData: "456789", code: codes.DataLoss, mention: "offset 10"},
		"kept bytes within a limit": {req: &agentv1.ReadOutputRequest{Uid: "uid-cut", ObjectUrl: cutURL, Offset: 4, LimitBytes: 6},
			wantData: "456789"},
		"past the kept bytes": {req: &agentv1.ReadOutputRequest{Uid: "uid-cut", ObjectUrl: cutURL, Offset: 12},
			code: codes.DataLoss, mention: "offset 12"},
		"missing object": {req: &agentv1.ReadOutputRequest{Uid: "uid-none", ObjectUrl: base + "/ns/task-uid-none/uid-none/stdout"},
			code: codes.NotFound, mention: "missing"},
		"another bucket": {req: &agentv1.ReadOutputRequest{Uid: "uid-obj", ObjectUrl: "file:///etc/passwd"},
			code: codes.FailedPrecondition, mention: "not in this agent's bucket"},
		"a bucket whose name extends the agent's": {req: &agentv1.ReadOutputRequest{Uid: "uid-obj", ObjectUrl: base + "x/ns/task-uid-obj/uid-obj/stdout"},
			code: codes.FailedPrecondition},
		"a key out of the bucket": {req: &agentv1.ReadOutputRequest{Uid: "uid-obj", ObjectUrl: base + "/../etc/uid-obj/stdout"},
			code: codes.InvalidArgument, mention: "<namespace>/<name>/uid-obj/stdout"},
		"a key of another layout": {req: &agentv1.ReadOutputRequest{Uid: "uid-obj", ObjectUrl: base + "/ns/task-uid-obj/uid-obj/stdout.attrs"},
			code: codes.InvalidArgument},
		"a deeper key": {req: &agentv1.ReadOutputRequest{Uid: "uid-obj", ObjectUrl: base + "/ns/x/task-uid-obj/uid-obj/stdout"},
			code: codes.InvalidArgument},
		"an empty segment": {req: &agentv1.ReadOutputRequest{Uid: "uid-obj", ObjectUrl: base + "/ns//uid-obj/stdout"},
			code: codes.InvalidArgument},
		"another task's object": {req: &agentv1.ReadOutputRequest{Uid: "uid-cut", ObjectUrl: url},
			code: codes.InvalidArgument},
		"another stream's object": {req: &agentv1.ReadOutputRequest{Uid: "uid-obj", ObjectUrl: errURL},
			code: codes.InvalidArgument},
	} {
		t.Run(name, func(t *testing.T) {
			o := r.readOutput(ctx, tc.req)
			if string(o.data) != tc.wantData || status.Code(o.err) != tc.code || !strings.Contains(fmt.Sprint(o.err), tc.mention) {
				t.Errorf("%q, %v; want %q, then %v mentioning %q", o.data, o.err, tc.wantData, tc.code, tc.mention)
			}
			if tc.code != codes.OK && tc.code != codes.DataLoss && o.header != nil {
				t.Errorf("header %v before the refusal", o.header)
			}
		})
	}
}
