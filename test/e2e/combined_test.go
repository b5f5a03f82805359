package e2e

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"k8s.io/utils/ptr"
	ctrlclient "sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/bashtask/bashtask-operator/api/v1alpha1"
	"github.com/bashtask/bashtask-operator/client"
	"github.com/bashtask/bashtask-operator/internal/rig/testutil"
)

// lineWriter records each line written with its stream, in the order of
// the writes, for both streams of a Demux.
type lineWriter struct {
	mu    *sync.Mutex
	lines *[]string
	tag   string
}

func (w lineWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, l := range strings.SplitAfter(string(p), "\n") {
		if l != "" {
			*w.lines = append(*w.lines, w.tag+strings.TrimSuffix(l, "\n"))
		}
	}
	return len(p), nil
}

// demuxLines splits a framed stream=all body into "out:" and "err:" lines.
func demuxLines(t *testing.T, framed []byte) string {
	t.Helper()
	var mu sync.Mutex
	var lines []string
	if _, err := client.Demux(bytes.NewReader(framed), lineWriter{&mu, &lines, "out:"}, lineWriter{&mu, &lines, "err:"}); err != nil {
		t.Fatalf("demux: %v", err)
	}
	return strings.Join(lines, " ")
}

// TestOutputCombined reads stream=all through kube-apiserver: followed
// while the task runs (from 0 and from an offset inside the first frame's
// header), after it ended from its agent, and after the agent forgot it
// from the order journal in the bucket and the status tails; every read
// has the command's order and the same framed bytes from its offset.
func TestOutputCombined(t *testing.T) {
	ns := newNamespace(t)
	c := outputClient(t, adminConfig(t))
	bt := createTask(t, ns, "combined", `for i in 1 2 3 4 5; do echo out$i; sleep 0.2; echo err$i >&2; sleep 0.2; done`)
	var want []string
	for i := 1; i <= 5; i++ {
		want = append(want, fmt.Sprintf("out:out%d", i), fmt.Sprintf("err:err%d", i))
	}
	wantLines := strings.Join(want, " ")

	// Followed while it runs: the first frame comes before the task ends.
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	r, err := c.FollowLog(ctx, ns, bt.Name, client.LogOptions{Stream: "all", Follow: true})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	first := make([]byte, 13) // the header and "out1\n"
	if _, err := io.ReadFull(r, first); err != nil {
		t.Fatal(err)
	}
	var live struct {
		data []byte
		err  error
	}
	var wg sync.WaitGroup
	wg.Go(func() { live.data, live.err = readAll(t, c, ns, bt.Name, "all", 3, true) })
	rest, err := io.ReadAll(r)
	if err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	full := slices.Concat(first, rest)
	if got := demuxLines(t, full); got != wantLines {
		t.Fatalf("followed: %q, want %q", got, wantLines)
	}
	if live.err != nil || !bytes.Equal(live.data, full[3:]) {
		t.Errorf("followed from 3 (inside a header): %q, %v; want %q", live.data, live.err, full[3:])
	}

	done := testutil.WaitTerminal(t, k8s, ns, []string{bt.Name}, time.Minute)[bt.Name]
	for _, off := range []int64{0, 3, 10, int64(len(full))} {
		b, err := readAll(t, c, ns, bt.Name, "all", off, false)
		if err != nil || !bytes.Equal(b, full[off:]) {
			t.Errorf("ended, from %d: %q, %v; want %q", off, b, err, full[off:])
		}
	}
	// The agent forgets the task: the order journal comes from the
	// bucket, the streams from their status tails.
	waitForgotten(t, done)
	for _, off := range []int64{0, 3, 10} {
		b, err := readAll(t, c, ns, bt.Name, "all", off, true)
		if err != nil || !bytes.Equal(b, full[off:]) {
			t.Errorf("after the agent forgot it, from %d: %q, %v; want %q", off, b, err, full[off:])
		}
	}
}

// bigCombined writes stderr, 300 kB of stdout (longer than the status
// tail, so stdout is uploaded) and stderr again, with a pause at each
// switch: writes to the two streams closer together than a read may be
// read in either order (docs/output.md).
const bigCombined = `echo err0 >&2; sleep 0.2; head -c 225000 /dev/urandom | base64 -w 0; echo; sleep 0.2; echo err1 >&2`

// checkStoredCombined reads stream=all of bt, a bigCombined task its agent
// forgot, from storage: the demultiplexed streams are the status's, in
// the order written, and every offset (inside a header, inside the large
// frames) resumes with the same bytes.
func checkStoredCombined(t *testing.T, c *client.Client, ns string, bt *v1.BashTask) {
	t.Helper()
	full, err := readAll(t, c, ns, bt.Name, "all", 0, true)
	if err != nil {
		t.Fatal(err)
	}
	var out, errs bytes.Buffer
	var order []string
	if _, err := client.Demux(bytes.NewReader(full), io.MultiWriter(&out, orderTag{&order, "out"}), io.MultiWriter(&errs, orderTag{&order, "err"})); err != nil {
		t.Fatal(err)
	}
	if sha(out.Bytes()) != ptr.Deref(bt.Status.Stdout.SHA256, "") || errs.String() != "err0\nerr1\n" {
		t.Fatalf("stdout %d bytes (sha256 %s, status %s), stderr %q", out.Len(), sha(out.Bytes()), ptr.Deref(bt.Status.Stdout.SHA256, ""), errs.String())
	}
	if got := strings.Join(slices.Compact(order), " "); got != "err out err" {
		t.Errorf("order of the frames %q, want err out err", got)
	}
	for _, off := range []int64{3, 17, 20, 1<<20 + 30, int64(len(full)) - 7} {
		if off > int64(len(full)) {
			continue
		}
		b, err := readAll(t, c, ns, bt.Name, "all", off, false)
		if err != nil || !bytes.Equal(b, full[off:]) {
			t.Errorf("from %d: %d bytes, %v; want %d", off, len(b), err, len(full)-int(off))
		}
	}
}

// orderTag notes the stream of every write.
type orderTag struct {
	order *[]string
	tag   string
}

func (o orderTag) Write(p []byte) (int, error) {
	*o.order = append(*o.order, o.tag)
	return len(p), nil
}

// TestOutputCombinedUploaded: stream=all of a task whose stdout was
// uploaded to the controller's bucket, after its agent forgot it.
func TestOutputCombinedUploaded(t *testing.T) {
	ns := newNamespace(t)
	c := outputClient(t, adminConfig(t))
	bt := createTask(t, ns, "combined-big", bigCombined)
	done := testutil.WaitTerminal(t, k8s, ns, []string{bt.Name}, time.Minute)[bt.Name]
	waitForgotten(t, done)
	if err := k8s.Get(t.Context(), ctrlclient.ObjectKeyFromObject(done), done); err != nil {
		t.Fatal(err)
	}
	checkStoredCombined(t, c, ns, done)
}
