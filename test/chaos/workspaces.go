package main

import (
	"archive/tar"
	"bufio"
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/klauspost/compress/zstd"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/bashtask/bashtask-operator/api/v1alpha1"
)

// The workspaces of the workload (docs/chaos.md, "Workspaces"): a few
// BashWorkspaces on the tenant agents, each running one task after the
// other, with snapshots asked for at random times. Every task of a
// workspace reports to the harness's beacon over TCP, so the evidence of
// where and when a workspace's tasks ran, and of which files they saw, is
// the harness's own clock and the tasks' own words, not the controller's.

// poolLabel is the Node label that sorts the agents: "process" agents run
// the plain tasks, "tenant" agents the workspaces.
const poolLabel = "chaos.bashtask.dev/pool"

// genFile is the workspace file each task reads and increments: the
// generation of the workspace's files that the task saw.
const genFile = "gen"

// BeaconLine is one line a workspace task sent, as received.
type BeaconLine struct {
	// At is when the harness received it.
	At time.Time
	// Kind is start, beat or end.
	Kind string
	// Workspace, UID and Node are the task's workspace, BashTask UID and
	// node.
	Workspace, UID, Node string
	// Gen is, for start, the generation the task read from genFile.
	Gen int
}

// beacon is a TCP server on loopback that keeps every line the workspace
// tasks send.
type beacon struct {
	ln    net.Listener
	mu    sync.Mutex
	lines []BeaconLine
}

func newBeacon() (*beacon, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	b := &beacon{ln: ln}
	go b.serve()
	return b, nil
}

func (b *beacon) port() int { return b.ln.Addr().(*net.TCPAddr).Port }

func (b *beacon) serve() {
	for {
		conn, err := b.ln.Accept()
		if err != nil {
			return
		}
		go func() {
			defer conn.Close()
			sc := bufio.NewScanner(conn)
			for sc.Scan() {
				f := strings.Fields(sc.Text())
				if len(f) < 4 {
					continue
				}
				l := BeaconLine{At: time.Now(), Kind: f[0], Workspace: f[1], UID: f[2], Node: f[3]}
				if len(f) > 4 {
					l.Gen, _ = strconv.Atoi(f[4])
				}
				b.mu.Lock()
				b.lines = append(b.lines, l)
				b.mu.Unlock()
			}
		}()
	}
}

func (b *beacon) close() []BeaconLine {
	_ = b.ln.Close()
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]BeaconLine(nil), b.lines...)
}

// WorkspaceObservation is one poll of a workspace's status.
type WorkspaceObservation struct {
	// At is when the harness read it.
	At time.Time
	// Phase, Node and Epoch are the status's.
	Phase, Node string
	Epoch       int64
	// RestoredFrom is status.restoredFrom.url; Snapshot status.snapshot.url.
	RestoredFrom, Snapshot string
}

// workspaces runs the workspaces' part of the workload.
type workspaces struct {
	w      *workload
	names  []string
	beacon *beacon
	rng    *rand.Rand
	rngMu  sync.Mutex

	mu  sync.Mutex
	obs map[string][]WorkspaceObservation
	seq int
}

func (ws *workspaces) intn(n int) int {
	ws.rngMu.Lock()
	defer ws.rngMu.Unlock()
	return ws.rng.IntN(n)
}

// create makes the workspaces: network Node (so their tasks reach the
// beacon), on the tenant agents, a snapshot every minute while a task
// runs.
func (ws *workspaces) create(ctx context.Context) error {
	for _, name := range ws.names {
		bw := &v1.BashWorkspace{
			ObjectMeta: metav1.ObjectMeta{Namespace: ws.w.ns, Name: name},
			Spec: v1.BashWorkspaceSpec{
				NodeSelector: map[string]string{poolLabel: "tenant"},
				Network:      ptr.To(v1.NetworkNode),
				Snapshot:     &v1.WorkspaceSnapshotPolicy{IntervalSeconds: ptr.To(int32(60))},
			},
		}
		if err := retry(ctx, func() error {
			err := ws.w.c.Create(ctx, bw.DeepCopy())
			if apierrors.IsAlreadyExists(err) {
				return nil
			}
			return err
		}); err != nil {
			return fmt.Errorf("creating workspace %s: %w", name, err)
		}
	}
	return nil
}

// run drives every workspace until schedule ends: one task after the
// other (the next created once the previous is terminal), snapshots asked
// for every 5 to 15 s, and the status polled four times a second.
func (ws *workspaces) run(schedule, calls context.Context) {
	var wg sync.WaitGroup
	for _, name := range ws.names {
		wg.Go(func() { ws.tasks(schedule, calls, name) })
		wg.Go(func() { ws.snapshots(schedule, name) })
	}
	wg.Go(func() { ws.poll(calls) })
	wg.Wait()
}

func (ws *workspaces) script(name string, beats int) string {
	return fmt.Sprintf(`exec 3<>/dev/tcp/127.0.0.1/%d || exit 90
g=$(cat %[2]s 2>/dev/null || echo 0)
echo "start %[3]s $BASHTASK_UID $BASHTASK_NODE $g" >&3
echo $((g+1)) > %[2]s.new && mv %[2]s.new %[2]s
i=0; while [ $i -lt %[4]d ]; do echo "beat %[3]s $BASHTASK_UID $BASHTASK_NODE" >&3; sleep 0.25; i=$((i+1)); done
echo "end %[3]s $BASHTASK_UID $BASHTASK_NODE $((g+1))" >&3`, ws.beacon.port(), genFile, name, beats)
}

func (ws *workspaces) tasks(schedule, calls context.Context, name string) {
	for k := 0; schedule.Err() == nil; k++ {
		tname := fmt.Sprintf("%s-t%03d", name, k)
		bt := &v1.BashTask{
			ObjectMeta: metav1.ObjectMeta{Namespace: ws.w.ns, Name: tname, Labels: map[string]string{"chaos.bashtask.dev/kind": kindWorkspace}},
			Spec: v1.BashTaskSpec{
				Command:                ws.script(name, 4+ws.intn(36)),
				Workspace:              ptr.To(name),
				TimeoutSeconds:         ptr.To(int32(60)),
				KillGracePeriodSeconds: ptr.To(int32(3)),
				Env:                    []v1.EnvVar{{Name: "CHAOS_RUN", Value: ptr.To(ws.w.runID)}},
			},
		}
		info := ws.w.created(calls, bt, TaskInfo{Name: tname, Kind: kindWorkspace, Timeout: 60 * time.Second, Grace: 3 * time.Second})
		if info == nil {
			return
		}
		// The next task once this one is terminal, so that two tasks of a
		// workspace run at once only when the system lets a stale one go on.
		for calls.Err() == nil {
			if t := ws.w.rec.task(tname); t != nil && t.Status.Reason != nil {
				break
			}
			sleepCtx(calls, 200*time.Millisecond)
		}
		sleepCtx(schedule, time.Duration(200+ws.intn(1500))*time.Millisecond)
	}
}

func (ws *workspaces) snapshots(schedule context.Context, name string) {
	for {
		sleepCtx(schedule, time.Duration(5000+ws.intn(10000))*time.Millisecond)
		if schedule.Err() != nil {
			return
		}
		if err := ws.requestSnapshot(schedule, name); err != nil {
			ws.w.log("asking for a snapshot of %s: %v", name, err)
		}
	}
}

// requestSnapshot sets spec.snapshot.request to a new value.
func (ws *workspaces) requestSnapshot(ctx context.Context, name string) error {
	ws.mu.Lock()
	ws.seq++
	req := "chaos-" + strconv.Itoa(ws.seq)
	ws.mu.Unlock()
	patch := fmt.Appendf(nil, `{"spec":{"snapshot":{"request":%q}}}`, req)
	return retry(ctx, func() error {
		return ws.w.c.Patch(ctx, &v1.BashWorkspace{ObjectMeta: metav1.ObjectMeta{Namespace: ws.w.ns, Name: name}}, client.RawPatch("application/merge-patch+json", patch))
	})
}

func (ws *workspaces) poll(ctx context.Context) {
	for ctx.Err() == nil {
		for _, name := range ws.names {
			var bw v1.BashWorkspace
			gctx, cancel := context.WithTimeout(ctx, time.Second)
			err := ws.w.c.Get(gctx, client.ObjectKey{Namespace: ws.w.ns, Name: name}, &bw)
			cancel()
			if err != nil {
				continue
			}
			s := bw.Status
			o := WorkspaceObservation{At: time.Now(), Phase: string(ptr.Deref(s.Phase, "")), Node: ptr.Deref(s.NodeName, ""), Epoch: ptr.Deref(s.Epoch, 0)}
			if s.RestoredFrom != nil {
				o.RestoredFrom = ptr.Deref(s.RestoredFrom.URL, "")
			}
			if s.Snapshot != nil {
				o.Snapshot = ptr.Deref(s.Snapshot.URL, "")
			}
			ws.mu.Lock()
			ws.obs[name] = append(ws.obs[name], o)
			ws.mu.Unlock()
		}
		sleepCtx(ctx, 250*time.Millisecond)
	}
}

// holder returns the node holding a workspace as last polled, "" for none.
func (ws *workspaces) holder() string {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	var nodes []string
	for _, name := range ws.names {
		if o := ws.obs[name]; len(o) > 0 && o[len(o)-1].Node != "" {
			nodes = append(nodes, o[len(o)-1].Node)
		}
	}
	if len(nodes) == 0 {
		return ""
	}
	return nodes[ws.intn(len(nodes))]
}

func (ws *workspaces) observations() map[string][]WorkspaceObservation {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	out := map[string][]WorkspaceObservation{}
	for k, v := range ws.obs {
		out[k] = append([]WorkspaceObservation(nil), v...)
	}
	return out
}

// snapshotGens reads, for every snapshot URL the observations name, the
// generation its tree holds (tree/gen of the archive; 0 when the file is
// not in it), or an error text.
func snapshotGens(ctx context.Context, c *cluster, obs map[string][]WorkspaceObservation) map[string]SnapshotInfo {
	out := map[string]SnapshotInfo{}
	for _, os := range obs {
		for _, o := range os {
			for _, u := range []string{o.RestoredFrom, o.Snapshot} {
				if _, done := out[u]; u == "" || done {
					continue
				}
				out[u] = readSnapshotGen(ctx, c, u)
			}
		}
	}
	return out
}

// SnapshotInfo is what a snapshot object's tree holds of the workload.
type SnapshotInfo struct {
	// Gen is the generation in its genFile, -1 when it holds none.
	Gen int
	// Err says why the object could not be read.
	Err string
}

func readSnapshotGen(ctx context.Context, c *cluster, raw string) SnapshotInfo {
	u, err := url.Parse(raw)
	if err != nil {
		return SnapshotInfo{Err: err.Error()}
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	out, err := c.s3Client.GetObject(ctx, &s3.GetObjectInput{Bucket: aws.String(u.Host), Key: aws.String(strings.TrimPrefix(u.Path, "/"))})
	if err != nil {
		return SnapshotInfo{Err: err.Error()}
	}
	defer out.Body.Close()
	zr, err := zstd.NewReader(out.Body)
	if err != nil {
		return SnapshotInfo{Err: err.Error()}
	}
	defer zr.Close()
	tr := tar.NewReader(zr)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return SnapshotInfo{Gen: -1}
		}
		if err != nil {
			return SnapshotInfo{Err: err.Error()}
		}
		if strings.TrimSuffix(h.Name, "/") == "tree/"+genFile {
			b, err := io.ReadAll(io.LimitReader(tr, 64))
			if err != nil {
				return SnapshotInfo{Err: err.Error()}
			}
			g, err := strconv.Atoi(strings.TrimSpace(string(b)))
			if err != nil {
				return SnapshotInfo{Err: fmt.Sprintf("tree/%s holds %q", genFile, b)}
			}
			return SnapshotInfo{Gen: g}
		}
	}
}
