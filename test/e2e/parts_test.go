package e2e

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/bashtask/bashtask-operator/api/v1alpha1"
	btclient "github.com/bashtask/bashtask-operator/client"
	"github.com/bashtask/bashtask-operator/internal/rig/localcluster"
	"github.com/bashtask/bashtask-operator/internal/rig/testutil"
)

// megabyteCommand writes, each second for a minute, one MiB of lines
// "block <i> ..." (i from 1): output the test computes itself. It ends at
// the first failed write (the agent reading its pipe is gone), so no
// process of it outlives its agent for long.
const megabyteCommand = `for i in $(seq 60); do yes "block $i of a deterministic stream" | head -c 1048576 || exit 1; sleep 1; done`

// megabyteOutput is what megabyteCommand writes in its first n seconds.
func megabyteOutput(n int) []byte {
	var out []byte
	for i := 1; i <= n; i++ {
		line := []byte(fmt.Sprintf("block %d of a deterministic stream\n", i))
		block := bytes.Repeat(line, 1048576/len(line)+1)[:1048576]
		out = append(out, block...)
	}
	return out
}

// partInterval is bashtask-local's --output-part-interval: the most output
// time a lost node takes with it.
const partInterval = 2 * time.Second

// TestOutputSurvivesTheNode is the done-when of parts: an agent is killed
// for good, its state directory removed, 20 s into a task writing 1 MiB a
// second. The task ends AgentLost; the bytes up to the last part, at most
// the part interval behind the agent's last report, read through the API
// with the SHA-256 of the same prefix of the command's output; every byte
// after is reported lost and none is invented.
func TestOutputSurvivesTheNode(t *testing.T) {
	ns := newNamespace(t)
	c := outputClient(t, adminConfig(t))
	const node, agentName = "node-2", "agent-node-2"
	bt := createTask(t, ns, "survives", megabyteCommand, func(bt *v1.BashTask) { bt.Spec.NodeName = ptr.To(node) })

	// 20 MiB written (20 s in) and parts uploaded.
	var running v1.BashTask
	for deadline := time.Now().Add(2 * time.Minute); ; {
		if err := k8s.Get(t.Context(), client.ObjectKeyFromObject(bt), &running); err != nil {
			t.Fatal(err)
		}
		if st := running.Status.Stdout; st != nil && ptr.Deref(st.TotalBytes, 0) >= 20<<20 && st.Parts != nil {
			break
		}
		if running.Status.Reason != nil || time.Now().After(deadline) {
			t.Fatalf("task did not write 20 MiB with parts kept: status %+v", running.Status)
		}
		time.Sleep(100 * time.Millisecond)
	}

	// The node goes for good: the agent stays down and its state
	// directory, with the spill file, is gone.
	hold := localcluster.HoldPath(clusterDir, agentName)
	if err := os.MkdirAll(filepath.Dir(hold), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(hold, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	pid := componentPid(t, agentName)
	t.Cleanup(func() { releaseAgent(t, agentName, pid) })
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatalf("killing %s (pid %d): %v", agentName, pid, err)
	}
	for deadline := time.Now().Add(30 * time.Second); syscall.Kill(pid, 0) == nil; {
		if time.Now().After(deadline) {
			t.Fatalf("%s (pid %d) still alive 30 s after SIGKILL", agentName, pid)
		}
		time.Sleep(50 * time.Millisecond)
	}
	killedAt := time.Now()
	if err := os.RemoveAll(filepath.Join(clusterDir, "agents", node)); err != nil {
		t.Fatal(err)
	}

	done := testutil.WaitTerminal(t, k8s, ns, []string{bt.Name}, 2*time.Minute)[bt.Name]
	if reason := ptr.Deref(done.Status.Reason, ""); reason != v1.ReasonAgentLost {
		t.Fatalf("reason %s (%s), want AgentLost", reason, ptr.Deref(done.Status.Message, ""))
	}
	st := done.Status.Stdout
	if st == nil || st.Parts == nil || st.Parts.KeptBytes == nil || st.Parts.LostFromOffset == nil {
		t.Fatalf("stdout %+v: want parts with keptBytes and lostFromOffset", st)
	}
	kept, total := *st.Parts.KeptBytes, ptr.Deref(st.TotalBytes, 0)
	t.Logf("agent killed after %d bytes reported; %d bytes kept in parts; AgentLost %s after the kill", total, kept, time.Since(killedAt).Round(time.Second))
	if *st.Parts.LostFromOffset != kept {
		t.Errorf("lostFromOffset %d, keptBytes %d: want them equal", *st.Parts.LostFromOffset, kept)
	}
	// At 1 MiB a second, a part interval and the time one part takes to
	// upload (a second on a loaded machine) behind the last report.
	if lag := total - kept; kept <= 0 || lag > int64(partInterval/time.Second+1)<<20 {
		t.Errorf("kept %d of %d reported bytes: more than %s of output behind", kept, total, partInterval+time.Second)
	}
	if msg := ptr.Deref(done.Status.Message, ""); !strings.Contains(msg, fmt.Sprintf("every byte from offset %d on lost", kept)) {
		t.Errorf("message %q does not say the bytes from offset %d on are lost", msg, kept)
	}

	want := megabyteOutput(60)[:kept]
	got, err := readAll(t, c, ns, bt.Name, "stdout", 0, false)
	var se *btclient.StreamError
	if !errors.As(err, &se) || se.Offset != kept || !strings.Contains(se.Message, "lost") {
		t.Errorf("reading from 0: %d bytes, %v; want %d bytes, then the error that the rest is lost at offset %d", len(got), err, kept, kept)
	}
	if int64(len(got)) != kept || sha(got) != sha(want) {
		t.Errorf("read %d bytes with SHA-256 %s; want the command's first %d bytes, %s", len(got), sha(got), kept, sha(want))
	}
	// From inside the kept bytes: the same bytes.
	mid := kept / 3
	if got, _ := readAll(t, c, ns, bt.Name, "stdout", mid, false); !bytes.Equal(got, want[mid:]) {
		t.Errorf("from %d: %d bytes, not the command's", mid, len(got))
	}
	// Both streams in one (stderr is empty): the kept bytes in frames of
	// at most 1 MiB, then the error that the rest is lost.
	r, err := c.FollowLog(t.Context(), ns, bt.Name, btclient.LogOptions{Stream: "all"})
	if err != nil {
		t.Fatal(err)
	}
	var all bytes.Buffer
	_, err = btclient.Demux(r, &all, io.Discard)
	_ = r.Close()
	if !errors.As(err, &se) || !strings.Contains(se.Message, "lost") || !bytes.Equal(all.Bytes(), want) {
		t.Errorf("stream=all: %d bytes, %v; want the %d kept, then the error that the rest is lost", all.Len(), err, kept)
	}
	// At and past the last kept byte: nothing invented.
	for _, off := range []int64{kept, kept + 1, total + 1<<20} {
		b, err := readAll(t, c, ns, bt.Name, "stdout", off, false)
		if len(b) != 0 || !isCode(err, http.StatusGone) || !strings.Contains(err.Error(), fmt.Sprintf("offset %d", kept)) {
			t.Errorf("from %d: %d bytes, %v; want 410 naming offset %d", off, len(b), err, kept)
		}
	}
}

// releaseAgent lets the launcher start the held agent again and waits
// until it runs, for the tests after this one.
func releaseAgent(t *testing.T, name string, oldPid int) {
	t.Helper()
	if err := os.Remove(localcluster.HoldPath(clusterDir, name)); err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Error(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for p := componentPidOrZero(name); p == 0 || p == oldPid; p = componentPidOrZero(name) {
		if time.Now().After(deadline) {
			t.Errorf("%s was not started again", name)
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
}
