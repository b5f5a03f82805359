package agent_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	agentv1 "github.com/bashtask/bashtask-operator/api/agent/v1"
)

// readCombined reads ReadCombinedOutput from offset until want bytes came
// or the stream ended; it returns the data and the stream's end error (nil
// at its end message).
func readCombined(ctx context.Context, t *testing.T, c agentv1.ExecutorClient, uid string, offset int64, follow bool, want int) ([]byte, error) {
	t.Helper()
	rs, err := c.ReadCombinedOutput(ctx, &agentv1.ReadCombinedOutputRequest{Uid: uid, Offset: offset, Follow: follow})
	if err != nil {
		return nil, err
	}
	var data []byte
	for want <= 0 || len(data) < want {
		m, err := rs.Recv()
		if errors.Is(err, io.EOF) {
			return data, nil
		}
		if err != nil {
			return data, err
		}
		data = append(data, m.GetData()...)
	}
	return data, nil
}

// TestCombinedAfterKill: a follower of both streams gets frames while the
// task runs, the last of them framed for it while its run was being read;
// the command writes more of that stream; the agent is killed with
// SIGKILL. The next agent process on the same state directory serves the
// recovered task's framed stream with every frame the follower had, the
// later bytes in a frame of their own after them.
func TestCombinedAfterKill(t *testing.T) {
	p := newPKI(t)
	stateDir := filepath.Join(t.TempDir(), "state")
	bucketURL := "file://" + t.TempDir()
	const uid = "combined-kill"
	first := startAgent(t, p, stateDir, bucketURL, nil, "--cgroups", "off")
	c1 := first.client(t, p)
	w1 := watch(t, c1)
	if _, err := c1.Start(t.Context(), &agentv1.StartRequest{Spec: &agentv1.TaskSpec{
		Ref:     &agentv1.TaskRef{Namespace: "ns", Name: "combined", Uid: uid},
		Command: "echo o1; sleep 0.2; echo e1 >&2; sleep 0.2; echo o2; sleep 1; echo o3; sleep 60",
		Timeout: durationpb.New(120 * time.Second),
	}}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	// Three frames of 8+3 bytes: o1, e1, o2, the last framed for the
	// follower while its run is still being read.
	live, err := readCombined(ctx, t, c1, uid, 0, true, 33)
	if err != nil || len(live) != 33 {
		t.Fatalf("followed %q, %v; want three frames", live, err)
	}
	want := []byte("\x01\x00\x00\x00\x00\x00\x00\x03o1\n\x02\x00\x00\x00\x00\x00\x00\x03e1\n\x01\x00\x00\x00\x00\x00\x00\x03o2\n")
	if !bytes.Equal(live, want) {
		t.Fatalf("followed %q, want %q", live, want)
	}
	w1.until(uid, 20*time.Second, "progress with o3", func(ev *agentv1.TaskEvent) bool {
		return ev.GetType() == agentv1.EventType_EVENT_TYPE_PROGRESS && ev.GetStatus().GetStdout().GetTail() == "o1\no2\no3\n"
	})
	first.kill()
	want = append(want, "\x01\x00\x00\x00\x00\x00\x00\x03o3\n"...)

	second := startAgent(t, p, stateDir, bucketURL, nil, "--cgroups", "off")
	c2 := second.client(t, p)
	w2 := watch(t, c2)
	w2.until(uid, 20*time.Second, "current state", isType(agentv1.EventType_EVENT_TYPE_CURRENT))
	again, err := readCombined(ctx, t, c2, uid, 0, true, 0)
	if err != nil || !bytes.Equal(again, want) {
		t.Errorf("after the restart: %q, %v; want %q", again, err, want)
	}
	rest, err := readCombined(ctx, t, c2, uid, int64(len(live)), true, 0)
	if err != nil || !bytes.Equal(rest, want[len(live):]) {
		t.Errorf("resumed at %d after the restart: %q, %v; want %q", len(live), rest, err, want[len(live):])
	}
}
