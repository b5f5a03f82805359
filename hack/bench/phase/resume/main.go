// Package resume is the resume phase of hack/bench (formerly
// hack/bench-resume). It measures how long a Suspended BashWorkspace takes
// to come back: from the action that resumes it until its first task
// starts (target: p50 <= 2 s for a workspace of 100 MiB on the local
// cluster; docs/performance.md).
//
// It starts a local cluster of its own (internal/rig/localcluster, the parts
// bashtask-local runs: etcd, kube-apiserver, the controller and -agents
// agents as separate processes, at the tenant isolation level, with a
// versitygw S3 bucket they share, as the e2e suite's), creates a
// workspace with the agents' defaults (a 10Gi file system, network
// Egress) and fills it through a task with about 100 MiB of mixed files:
// 64 MiB of random bytes (one file of 40 MiB, 24 of 1 MiB), 24 MiB of
// log-like text in 8 files and about 12 MiB of small text files in 60
// directories, with empty directories and symbolic links. Then, for each
// resume mode, -rounds rounds of
//
//   - spec: spec.suspend=true, wait until the workspace is Suspended and
//     its node's copy released (status.nodeName unset); then the action,
//     spec.suspend=false followed at once by a task naming it;
//   - task: spec.idleTimeoutSeconds=1, so the workspace suspends itself a
//     second after its last task ended; wait until Suspended and
//     released; then the action, a task naming it.
//
// The task is `echo $EPOCHREALTIME`: the shell's clock when it ran the
// command, on the machine the client runs on, so the figure is that clock
// minus the client's clock just before the action's first API call. Each
// round also records when the client's watch saw the workspace Pending
// (the controller began the restore), Ready (the agent made the copy: a
// new file system, the network, the snapshot's download and unpack) and
// the task started (phase Running), and the agent's own time for the
// restore and for the snapshot of the suspend, from its log ("workspace
// restored", "workspace snapshot written"); of a suspend, also the time
// from the watch's Suspended to the node's copy released. The last task checks that
// the files came back as the fill wrote them, through every round's
// snapshot and restore.
//
// It prints every round, then p50, p90 and max; the figures are the
// phase's JSON section, and the system phase's table takes in some of
// them. Run as root (the tenant level), after `make build envtest
// setup-s3`.
//
// The phase starts a local cluster of its own instead of the shared one
// of hack/bench: it needs a versitygw S3 bucket (the snapshots go there,
// as in a cluster) and the tenant level whatever -isolation says, and its
// restore times are those of an otherwise idle cluster.
package resume

import (
	"cmp"
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/bashtask/bashtask-operator/api/v1alpha1"
	"github.com/bashtask/bashtask-operator/hack/bench/phase"
	"github.com/bashtask/bashtask-operator/hack/bench/report"
	"github.com/bashtask/bashtask-operator/hack/bench/stats"
	"github.com/bashtask/bashtask-operator/internal/rig/localcluster"
)

const (
	// namespace holds the bench's workspace and tasks.
	namespace = "bench-resume"
	// workspaceName is the one workspace the bench suspends and resumes.
	workspaceName = "resume"
	// targetMs is the target for the p50 of the first task's
	// start after a resume, in milliseconds.
	targetMs = 2000
)

// Resume modes: what resumes the workspace.
const (
	modeSpec = "spec" // spec.suspend set back to false, then a task
	modeTask = "task" // a task naming a workspace its idle timeout suspended
)

type options struct {
	binDir, assetsDir, crdDir, admissionDir string
	rounds, agents                          int
	modes                                   []string
	timeout                                 time.Duration
	keep                                    bool
}

// Phase is the resume phase.
type Phase struct {
	o     options
	modes string
}

// Name is "resume".
func (*Phase) Name() string { return "resume" }

// Flags registers the flags of the former hack/bench-resume.
func (p *Phase) Flags(fs *flag.FlagSet) {
	o := &p.o
	fs.StringVar(&o.binDir, "bin-dir", "bin", "directory of bashtask-controller, bashtask-agent and versitygw")
	fs.StringVar(&o.assetsDir, "assets-dir", cmp.Or(os.Getenv("KUBEBUILDER_ASSETS"), filepath.Join("bin", "k8s")), "directory of kube-apiserver and etcd")
	fs.StringVar(&o.crdDir, "crd-dir", filepath.Join("config", "crd", "bases"), "CRD manifests")
	fs.StringVar(&o.admissionDir, "admission-dir", filepath.Join("config", "admission"), "admission policies")
	fs.IntVar(&o.rounds, "rounds", 10, "suspend and resume rounds of each mode")
	fs.IntVar(&o.agents, "agents", 2, "agents of the local cluster (a resume may land on any of them)")
	fs.StringVar(&p.modes, "modes", modeSpec+","+modeTask, "resume modes, in this order: spec (spec.suspend=false, then a task), task (a task for a workspace suspended by its idle timeout)")
	fs.DurationVar(&o.timeout, "step-timeout", 3*time.Minute, "longest wait for one step (the fill, a suspend, a resume, the first task's end)")
	fs.BoolVar(&o.keep, "keep", false, "keep the cluster directory (component logs, agent state); it is always kept after a failure")
}

// Run measures and prints the resume's rounds and table.
func (p *Phase) Run(ctx context.Context, _ *phase.Env) (phase.Figures, error) {
	o := p.o
	o.modes = nil
	for m := range strings.SplitSeq(p.modes, ",") {
		if m != modeSpec && m != modeTask {
			return nil, fmt.Errorf("-modes: %q is neither %s nor %s", m, modeSpec, modeTask)
		}
		o.modes = append(o.modes, m)
	}
	if o.rounds < 1 {
		return nil, fmt.Errorf("-rounds must be at least 1")
	}
	return run(ctx, o)
}

func run(ctx context.Context, o options) (f phase.Figures, err error) {
	if os.Geteuid() != 0 {
		return nil, fmt.Errorf("run as root: workspaces need agents at the tenant isolation level (euid %d)", os.Geteuid())
	}
	dir, err := os.MkdirTemp("", "bench-resume-")
	if err != nil {
		return nil, err
	}
	defer func() {
		if o.keep || err != nil {
			fmt.Fprintf(os.Stderr, "bench resume: logs and state kept in %s\n", dir)
			return
		}
		_ = os.RemoveAll(dir)
	}()
	load0 := phase.LoadAvg()
	fmt.Printf("machine: %d CPUs, load average %s\n", runtime.NumCPU(), load0)
	fmt.Printf("starting a local cluster in %s: %d agents at the tenant level, versitygw S3\n", dir, o.agents)
	c, err := localcluster.Up(ctx, localcluster.LauncherOptions{
		Dir: dir, BinDir: o.binDir, AssetsDir: o.assetsDir, CRDDir: o.crdDir, AdmissionDir: o.admissionDir,
		Agents: o.agents, S3: true, Isolation: "tenant",
		Log: slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		return nil, err
	}
	defer c.Down()
	defer func() {
		if err != nil {
			localcluster.WriteLogTails(os.Stderr, dir, 15)
		}
	}()
	k8s, err := newClient(ctx, c.Kubeconfig)
	if err != nil {
		return nil, err
	}
	if err := k8s.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace}}); err != nil && !apierrors.IsAlreadyExists(err) {
		return nil, fmt.Errorf("creating namespace %s: %w", namespace, err)
	}
	if err := localcluster.WaitAdmission(ctx, k8s, namespace); err != nil {
		return nil, err
	}
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	b := &bench{
		c: k8s, o: o, logDir: filepath.Join(dir, "logs"),
		ws:    newEvents[*v1.BashWorkspace]("BashWorkspace"),
		tasks: newEvents[*v1.BashTask]("BashTask"),
	}
	go follow(wctx, k8s, namespace, func() client.ObjectList { return &v1.BashWorkspaceList{} }, b.ws)
	go follow(wctx, k8s, namespace, func() client.ObjectList { return &v1.BashTaskList{} }, b.tasks)

	defer func() {
		// The workspace goes with the cluster either way; deleting it
		// first has the agent remove its copy (and its mounts) itself.
		dctx, dcancel := context.WithTimeout(context.Background(), time.Minute)
		defer dcancel()
		if derr := b.deleteWorkspace(dctx); derr != nil && err == nil {
			err = derr
		}
	}()
	if err := b.prepare(ctx); err != nil {
		return nil, err
	}
	for _, mode := range o.modes {
		fmt.Printf("\n== %d rounds of mode %s: %s\n", o.rounds, mode, modeText(mode))
		for i := range o.rounds {
			r, err := b.round(ctx, mode)
			if err != nil {
				return nil, fmt.Errorf("round %d of mode %s: %w", i+1, mode, err)
			}
			b.rounds = append(b.rounds, r)
			fmt.Println(r.line(i + 1))
		}
	}
	if err := b.verify(ctx); err != nil {
		return nil, err
	}
	b.report(load0, phase.LoadAvg())
	return b.figures(load0, phase.LoadAvg()), nil
}

func modeText(mode string) string {
	if mode == modeSpec {
		return "suspended by spec.suspend=true; resumed by spec.suspend=false, then a task"
	}
	return "suspended by its idle timeout (1 s); resumed by a task naming it"
}

// newClient is an administrator's client of the cluster with a fixed REST
// mapper: the lazy one reads discovery, which lags behind on a loaded
// machine.
func newClient(ctx context.Context, kubeconfig string) (client.WithWatch, error) {
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return nil, err
	}
	cfg.QPS, cfg.Burst = 100, 200
	c, err := phase.NewClient(cfg)
	if err != nil {
		return nil, err
	}
	for deadline := time.Now().Add(time.Minute); ; {
		err := c.List(ctx, &v1.BashWorkspaceList{}, client.Limit(1))
		if err == nil {
			return c, nil
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("BashWorkspaces not served: %w", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// bench is one run: the client, its watches and the rounds measured.
type bench struct {
	c      client.WithWatch
	o      options
	logDir string // the components' logs, logs/agent-<node>.log
	ws     *events[*v1.BashWorkspace]
	tasks  *events[*v1.BashTask]

	tasksMade int
	digest    string // the fill's listing and content digest
	dataBytes int64  // the snapshot's file data, from status.snapshot
	archive   int64  // the snapshot's object size
	rounds    []round
}

// round is one suspend and resume; durations in milliseconds from the
// action's first API call, NaN where not known.
type round struct {
	mode, node string
	// suspend is from the spec.suspend=true patch until the watch saw the
	// workspace Suspended and released (spec mode only).
	suspend float64
	// snapshot is the agent's time for the snapshot of the suspend.
	snapshot float64
	// release is from the watch seeing the workspace Suspended (its
	// snapshot recorded) until it saw the node's copy released.
	release float64
	// first is the headline: until the first task's shell ran its command.
	first float64
	// running, pending and ready: until the watch saw the task Running,
	// the workspace Pending (the restore begun) and Ready (the copy made).
	running, pending, ready float64
	// restore is the agent's time for the download and unpack.
	restore float64
}

func (r round) line(n int) string {
	return fmt.Sprintf("round %2d %-4s first task started %s after the action (API saw it Running at %s): Pending %s, Ready %s on %s (restore %s), suspend %s (snapshot %s, release %s); load %s",
		n, r.mode, sec(r.first), sec(r.running), sec(r.pending), sec(r.ready), r.node, sec(r.restore), sec(r.suspend), sec(r.snapshot), sec(r.release), phase.LoadAvg())
}

func sec(ms float64) string {
	if math.IsNaN(ms) {
		return "-"
	}
	return fmt.Sprintf("%.2fs", ms/1000)
}

// fillScript writes about 100 MiB of mixed files under data/ and prints
// the tree's digest (digestScript).
const fillScript = `set -euo pipefail
mkdir -p data/blobs data/logs data/empty/a/b
head -c 41943040 /dev/urandom > data/blobs/pack
for i in $(seq -w 0 23); do head -c 1048576 /dev/urandom > data/blobs/b$i; done
mkdir -p data/src/pkg{00..59}
awk 'BEGIN {
  for (f = 0; f < 8; f++) {
    out = sprintf("data/logs/build-%d.log", f); n = 0
    for (i = 0; n < 3145728; i++) {
      line = sprintf("2026-12-02T03:%02d:%02d.%06dZ INFO step=%d worker=%d took %dms status=ok path=/home/task/repo/pkg/%d/file%d.go\n", int(i/60)%60, i%60, (i*7919)%1000000, i, i%16, (i*104729)%5000, i%60, i%97)
      printf "%s", line > out; n += length(line)
    }
    close(out)
  }
  for (f = 0; f < 3000; f++) {
    out = sprintf("data/src/pkg%02d/f%04d.go", f%60, f); n = 0
    printf "package pkg%02d\n\n", f%60 > out
    for (l = 0; n < 4096; l++) {
      line = sprintf("func F%d_%d(x int) int { return x*%d + %d }\n", f, l, (f*31+l)%1000, l)
      printf "%s", line > out; n += length(line)
    }
    close(out)
  }
}'
ln -s ../blobs/pack data/src/pack-link
ln -s missing data/src/dangling
` + digestScript

// digestScript prints a line naming every entry of data/ with its type
// and mode, and every regular file's content, as one digest, and the
// count of entries.
const digestScript = `echo "$( (cd data && find . -printf '%y %m %p %l\n' | LC_ALL=C sort && find . -type f -print0 | LC_ALL=C sort -z | xargs -0 cat) | sha256sum | cut -d' ' -f1) $(find data | wc -l)"`

// prepare creates the workspace, fills it and waits until it is Ready
// with its fill done.
func (b *bench) prepare(ctx context.Context) error {
	ws := &v1.BashWorkspace{ObjectMeta: metav1.ObjectMeta{Name: workspaceName, Namespace: namespace}}
	from := b.ws.mark()
	start := time.Now()
	if err := b.c.Create(ctx, ws); err != nil {
		return fmt.Errorf("creating workspace %s: %w", workspaceName, err)
	}
	ev, _, err := b.ws.wait(ctx, from, b.o.timeout, "Ready", workspaceName, wsReady(0), describeWorkspace)
	if err != nil {
		return err
	}
	fmt.Printf("workspace %s Ready on %s in %s\n", workspaceName, ptr.Deref(ev.obj.Status.NodeName, "?"), time.Since(start).Round(time.Millisecond))
	start = time.Now()
	out, err := b.runTask(ctx, fillScript, b.o.timeout)
	if err != nil {
		return fmt.Errorf("the fill: %w", err)
	}
	b.digest = out
	fmt.Printf("filled in %s (digest and entries: %s)\n", time.Since(start).Round(time.Millisecond), out)
	return nil
}

// verify runs a task that computes the tree's digest again: every
// round's snapshot and restore must have kept it.
func (b *bench) verify(ctx context.Context) error {
	out, err := b.runTask(ctx, digestScript, b.o.timeout)
	if err != nil {
		return fmt.Errorf("the check of the files: %w", err)
	}
	if out != b.digest {
		return fmt.Errorf("after %d restores the files differ from the fill's: digest and entries %q, the fill's %q", len(b.rounds), out, b.digest)
	}
	fmt.Printf("\nafter %d restores the files are the fill's (%s)\n", len(b.rounds), out)
	return nil
}

// newTask creates a task of the workspace running command and returns its
// name.
func (b *bench) newTask(ctx context.Context, command string) (string, error) {
	b.tasksMade++
	name := fmt.Sprintf("t-%03d", b.tasksMade)
	bt := &v1.BashTask{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace},
		Spec: v1.BashTaskSpec{Command: command, Workspace: ptr.To(workspaceName)}}
	if err := b.c.Create(ctx, bt); err != nil {
		return "", fmt.Errorf("creating task %s: %w", name, err)
	}
	return name, nil
}

// runTask runs command in the workspace and returns its stdout's tail,
// trimmed, once it succeeded.
func (b *bench) runTask(ctx context.Context, command string, timeout time.Duration) (string, error) {
	from := b.tasks.mark()
	name, err := b.newTask(ctx, command)
	if err != nil {
		return "", err
	}
	ev, _, err := b.tasks.wait(ctx, from, timeout, "Succeeded", name, taskSucceeded, describeTask)
	if err != nil {
		return "", err
	}
	return strings.TrimSpace(ptr.Deref(stdoutTail(ev.obj), "")), nil
}

// round suspends the workspace as mode does and resumes it, timing the
// resume.
func (b *bench) round(ctx context.Context, mode string) (round, error) {
	r := round{mode: mode, suspend: math.NaN(), snapshot: math.NaN(), release: math.NaN(), restore: math.NaN()}
	var patch string
	if mode == modeSpec {
		patch = `{"spec":{"suspend":true,"idleTimeoutSeconds":null}}`
	} else {
		patch = `{"spec":{"suspend":null,"idleTimeoutSeconds":1}}`
	}
	// From the workspace's state as last seen: in the task mode the idle
	// timeout may have suspended it already, and the patch changes
	// nothing.
	from, before, _ := b.ws.latest(workspaceName)
	wasReady := before != nil && ptr.Deref(before.Status.Phase, "") == v1.WorkspaceReady
	start := time.Now()
	generation, err := b.patch(ctx, patch)
	if err != nil {
		return r, err
	}
	sus, next, err := b.ws.wait(ctx, from, b.o.timeout, "Suspended", workspaceName, wsSuspended(generation, false), describeWorkspace)
	if err != nil {
		return r, err
	}
	ev, _, err := b.ws.wait(ctx, next-1, b.o.timeout, "Suspended with its node's copy released", workspaceName, wsSuspended(generation, true), describeWorkspace)
	if err != nil {
		return r, err
	}
	if mode == modeSpec && wasReady {
		r.suspend = msSince(start, ev.at)
	}
	if next-1 > from {
		// Both seen in this round: the release is the agent's deletion
		// of the copy and the status write after it.
		r.release = msSince(sus.at, ev.at)
	}
	snap := ev.obj.Status.Snapshot
	if snap == nil || snap.URL == nil {
		return r, fmt.Errorf("workspace %s is Suspended without a snapshot in its status", workspaceName)
	}
	b.dataBytes, b.archive = ptr.Deref(snap.DataBytes, 0), ptr.Deref(snap.Bytes, 0)
	if took, err := agentTook(b.logDir, "workspace snapshot written", *snap.URL); err == nil {
		r.snapshot = ms(took)
	} else {
		fmt.Fprintf(os.Stderr, "bench resume: the agent's time for snapshot %s: %v\n", *snap.URL, err)
	}
	epoch := ptr.Deref(ev.obj.Status.Epoch, 0)

	// The action. From here on every figure counts from start.
	wsFrom, taskFrom := b.ws.mark(), b.tasks.mark()
	start = time.Now()
	if mode == modeSpec {
		if _, err := b.patch(ctx, `{"spec":{"suspend":false}}`); err != nil {
			return r, err
		}
	}
	name, err := b.newTask(ctx, `echo "$EPOCHREALTIME"`)
	if err != nil {
		return r, err
	}
	pending, next, err := b.ws.wait(ctx, wsFrom, b.o.timeout, "Pending (being restored)", workspaceName, wsPending(epoch), describeWorkspace)
	if err != nil {
		return r, err
	}
	// From the Pending event itself: the watch may have delivered the
	// Ready state in it.
	ready, _, err := b.ws.wait(ctx, next-1, b.o.timeout, "Ready again", workspaceName, wsReady(epoch), describeWorkspace)
	if err != nil {
		return r, err
	}
	running, next, err := b.tasks.wait(ctx, taskFrom, b.o.timeout, "started", name, taskStarted, describeTask)
	if err != nil {
		return r, err
	}
	done := running
	if !taskSucceededNow(running.obj) {
		if done, _, err = b.tasks.wait(ctx, next, b.o.timeout, "Succeeded", name, taskSucceeded, describeTask); err != nil {
			return r, err
		}
	}
	clock, err := epochRealtime(strings.TrimSpace(ptr.Deref(stdoutTail(done.obj), "")))
	if err != nil {
		return r, fmt.Errorf("task %s: %w", name, err)
	}
	r.first = msSince(start, clock)
	r.running = msSince(start, running.at)
	r.pending, r.ready = msSince(start, pending.at), msSince(start, ready.at)
	r.node = ptr.Deref(ready.obj.Status.NodeName, "?")
	if rf := ready.obj.Status.RestoredFrom; rf == nil || ptr.Deref(rf.URL, "") != *snap.URL {
		return r, fmt.Errorf("workspace %s is Ready without status.restoredFrom naming its snapshot %s: %s", workspaceName, *snap.URL, describeWorkspace(ready.obj))
	}
	if took, err := agentTook(b.logDir, "workspace restored", *snap.URL); err == nil {
		r.restore = ms(took)
	} else {
		fmt.Fprintf(os.Stderr, "bench resume: the agent's time for the restore of %s: %v\n", *snap.URL, err)
	}
	return r, nil
}

// patch merges body into the workspace and returns its generation after
// the patch.
func (b *bench) patch(ctx context.Context, body string) (int64, error) {
	ws := &v1.BashWorkspace{ObjectMeta: metav1.ObjectMeta{Name: workspaceName, Namespace: namespace}}
	if err := b.c.Patch(ctx, ws, client.RawPatch(types.MergePatchType, []byte(body))); err != nil {
		return 0, fmt.Errorf("patching workspace %s with %s: %w", workspaceName, body, err)
	}
	return ws.Generation, nil
}

// deleteWorkspace deletes the workspace and waits until it is gone: its
// agent has removed its copy.
func (b *bench) deleteWorkspace(ctx context.Context) error {
	ws := &v1.BashWorkspace{ObjectMeta: metav1.ObjectMeta{Name: workspaceName, Namespace: namespace}}
	if err := b.c.Delete(ctx, ws); err != nil {
		if apierrors.IsNotFound(err) {
			return nil
		}
		return fmt.Errorf("deleting workspace %s: %w", workspaceName, err)
	}
	for {
		err := b.c.Get(ctx, client.ObjectKeyFromObject(ws), ws)
		if apierrors.IsNotFound(err) {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("workspace %s not gone after its deletion: %s", workspaceName, describeWorkspace(ws))
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// wsReady holds for the workspace Ready on a node at an epoch after
// epoch; a Failed or NodeLost workspace ends the wait.
func wsReady(epoch int64) func(*v1.BashWorkspace) (bool, error) {
	return func(ws *v1.BashWorkspace) (bool, error) {
		if err := wsFinal(ws); err != nil {
			return false, err
		}
		return ptr.Deref(ws.Status.Phase, "") == v1.WorkspaceReady && ws.Status.NodeName != nil && ptr.Deref(ws.Status.Epoch, 0) > epoch, nil
	}
}

// wsPending holds for the workspace being made on a node at an epoch
// after epoch (the controller's write-ahead before it asks the agent), or
// already past that.
func wsPending(epoch int64) func(*v1.BashWorkspace) (bool, error) {
	return func(ws *v1.BashWorkspace) (bool, error) {
		if err := wsFinal(ws); err != nil {
			return false, err
		}
		return ws.Status.NodeName != nil && ptr.Deref(ws.Status.Epoch, 0) > epoch, nil
	}
}

// wsSuspended holds for the workspace Suspended once the controller has
// seen generation, with released its node's copy released too.
func wsSuspended(generation int64, released bool) func(*v1.BashWorkspace) (bool, error) {
	return func(ws *v1.BashWorkspace) (bool, error) {
		if err := wsFinal(ws); err != nil {
			return false, err
		}
		return ptr.Deref(ws.Status.Phase, "") == v1.WorkspaceSuspended && (!released || ws.Status.NodeName == nil) &&
			ptr.Deref(ws.Status.ObservedGeneration, 0) >= generation, nil
	}
}

func wsFinal(ws *v1.BashWorkspace) error {
	switch p := ptr.Deref(ws.Status.Phase, ""); p {
	case v1.WorkspaceFailed, v1.WorkspaceNodeLost:
		return fmt.Errorf("%w: phase %s: %s", errStop, p, ptr.Deref(ws.Status.Message, ""))
	}
	return nil
}

func describeWorkspace(ws *v1.BashWorkspace) string {
	return fmt.Sprintf("phase %s, node %s, epoch %d, generation %d observed %d: %s", ptr.Deref(ws.Status.Phase, "<none>"),
		ptr.Deref(ws.Status.NodeName, "<none>"), ptr.Deref(ws.Status.Epoch, 0), ws.Generation, ptr.Deref(ws.Status.ObservedGeneration, 0),
		ptr.Deref(ws.Status.Message, ""))
}

// taskStarted holds once the task's status shows it started: Running, or
// already ended after a start.
func taskStarted(bt *v1.BashTask) (bool, error) {
	if r := ptr.Deref(bt.Status.Reason, ""); r != "" && r != v1.ReasonSucceeded {
		return false, fmt.Errorf("%w: ended %s: %s", errStop, r, ptr.Deref(bt.Status.Message, ""))
	}
	return ptr.Deref(bt.Status.Phase, "") == v1.PhaseRunning || bt.Status.StartTime != nil || taskSucceededNow(bt), nil
}

func taskSucceeded(bt *v1.BashTask) (bool, error) {
	if r := ptr.Deref(bt.Status.Reason, ""); r != "" && r != v1.ReasonSucceeded {
		return false, fmt.Errorf("%w: ended %s: %s (stderr: %s)", errStop, r, ptr.Deref(bt.Status.Message, ""), ptr.Deref(stderrTail(bt), ""))
	}
	return taskSucceededNow(bt), nil
}

func taskSucceededNow(bt *v1.BashTask) bool {
	return ptr.Deref(bt.Status.Reason, "") == v1.ReasonSucceeded
}

func describeTask(bt *v1.BashTask) string {
	return fmt.Sprintf("phase %s, reason %s: %s", ptr.Deref(bt.Status.Phase, "<none>"), ptr.Deref(bt.Status.Reason, "<none>"), ptr.Deref(bt.Status.Message, ""))
}

func stdoutTail(bt *v1.BashTask) *string {
	if bt.Status.Stdout == nil {
		return nil
	}
	return bt.Status.Stdout.Tail
}

func stderrTail(bt *v1.BashTask) *string {
	if bt.Status.Stderr == nil {
		return nil
	}
	return bt.Status.Stderr.Tail
}

// epochRealtime reads bash's $EPOCHREALTIME (seconds and microseconds).
func epochRealtime(s string) (time.Time, error) {
	sec, frac, ok := strings.Cut(s, ".")
	n, err1 := strconv.ParseInt(sec, 10, 64)
	us, err2 := strconv.ParseInt((frac + "000000")[:6], 10, 64)
	if !ok || err1 != nil || err2 != nil {
		return time.Time{}, fmt.Errorf("stdout %q is not $EPOCHREALTIME", s)
	}
	return time.Unix(n, us*1000), nil
}

// agentLine matches an agent's text log line with a message, a key=
// attribute and a took= duration (executor/agent's workspace_snapshot.go).
var agentLine = regexp.MustCompile(`msg="([^"]*)".* key=(\S+) .*took=(\S+)`)

// agentTook finds, in the agents' logs under logDir, the line with
// message msg about the object of url, and returns its took. The log
// names the object by its key in the bucket, the part of the URL from
// "workspaces/" on.
func agentTook(logDir, msg, url string) (time.Duration, error) {
	i := strings.Index(url, "/workspaces/")
	if i < 0 {
		return 0, fmt.Errorf("snapshot URL %q has no workspaces/ key", url)
	}
	key := url[i+1:]
	logs, err := filepath.Glob(filepath.Join(logDir, "agent-*.log"))
	if err != nil || len(logs) == 0 {
		return 0, fmt.Errorf("no agent log in %s", logDir)
	}
	// The agent writes the line before it answers, but its log is a file
	// another process appends to: allow it a moment.
	for deadline := time.Now().Add(2 * time.Second); ; {
		for _, l := range logs {
			raw, err := os.ReadFile(l)
			if err != nil {
				return 0, err
			}
			if took, ok := findTook(string(raw), msg, key); ok {
				return took, nil
			}
		}
		if time.Now().After(deadline) {
			return 0, fmt.Errorf("no %q line for %s in %s", msg, key, strings.Join(logs, ", "))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// findTook returns the took= of the last line of log with message msg
// and key=key.
func findTook(log, msg, key string) (time.Duration, bool) {
	lines := strings.Split(log, "\n")
	for _, line := range slices.Backward(lines) {
		m := agentLine.FindStringSubmatch(line)
		if m == nil || m[1] != msg || m[2] != key {
			continue
		}
		if d, err := time.ParseDuration(m[3]); err == nil {
			return d, true
		}
	}
	return 0, false
}

// report prints the figures: over every round, then per mode, p50, p90
// and max, and the target.
func (b *bench) report(load0, load1 string) {
	col := func(pick func(round) float64, rounds []round) []float64 {
		var xs []float64
		for _, r := range rounds {
			if v := pick(r); !math.IsNaN(v) {
				xs = append(xs, v)
			}
		}
		return xs
	}
	fmt.Printf("\n== resume of a Suspended workspace of %.1f MiB of file data (archive %.1f MiB): %d CPUs, load average %s at start, %s at end\n",
		float64(b.dataBytes)/(1<<20), float64(b.archive)/(1<<20), runtime.NumCPU(), load0, load1)
	tw := report.NewTable(os.Stdout, false)
	fmt.Fprintf(tw, "from the action, ms\trounds\tp50\tp90\tmax\ttarget\t\n")
	row := func(what string, xs []float64, target string) {
		if len(xs) == 0 {
			return
		}
		fmt.Fprintf(tw, "%s\t%d\t%.0f\t%.0f\t%.0f\t%s\t\n", what, len(xs), stats.Percentile(xs, 0.5), stats.Percentile(xs, 0.9), slices.Max(xs), target)
	}
	first := col(func(r round) float64 { return r.first }, b.rounds)
	verdict := "ok"
	if stats.Percentile(first, 0.5) > targetMs {
		verdict = "MISS"
	}
	row("the first task started (its shell's clock)", first, fmt.Sprintf("p50 <= %d  %s", targetMs, verdict))
	for _, mode := range b.o.modes {
		rs := slices.DeleteFunc(slices.Clone(b.rounds), func(r round) bool { return r.mode != mode })
		row("  "+mode+": "+map[string]string{modeSpec: "spec.suspend=false, then a task", modeTask: "a task for an idle-suspended workspace"}[mode],
			col(func(r round) float64 { return r.first }, rs), "")
	}
	row("the API showed the task Running", col(func(r round) float64 { return r.running }, b.rounds), "")
	row("the workspace Pending (the restore begun)", col(func(r round) float64 { return r.pending }, b.rounds), "")
	row("the workspace Ready (the copy made)", col(func(r round) float64 { return r.ready }, b.rounds), "")
	fmt.Fprintf(tw, "\t\t\t\t\t\t\n")
	fmt.Fprintf(tw, "durations, ms\trounds\tp50\tp90\tmax\t\t\n")
	row("making the copy (Pending until Ready)", col(func(r round) float64 { return r.ready - r.pending }, b.rounds), "")
	row("  of it the restore, the agent's (download and unpack)", col(func(r round) float64 { return r.restore }, b.rounds), "")
	row("the task's start after Ready", col(func(r round) float64 { return r.first - r.ready }, b.rounds), "")
	row("a suspend (spec.suspend=true until released)", col(func(r round) float64 { return r.suspend }, b.rounds), "")
	row("  of it the snapshot, the agent's", col(func(r round) float64 { return r.snapshot }, b.rounds), "")
	row("  and the release (Suspended until the copy is gone)", col(func(r round) float64 { return r.release }, b.rounds), "")
	_ = tw.Flush()
}

// figures are the phase's figures (ms, MiB, the 1-minute load average).
func (b *bench) figures(load0, load1 string) phase.Figures {
	m := phase.Figures{}
	put := func(k string, v float64) {
		if !math.IsNaN(v) && !math.IsInf(v, 0) {
			m[k] = math.Round(v*100) / 100
		}
	}
	pick := func(f func(round) float64, mode string) []float64 {
		var xs []float64
		for _, r := range b.rounds {
			if v := f(r); (mode == "" || r.mode == mode) && !math.IsNaN(v) {
				xs = append(xs, v)
			}
		}
		return xs
	}
	first := pick(func(r round) float64 { return r.first }, "")
	put("resume.first_task_p50_ms", stats.Percentile(first, 0.5))
	put("resume.first_task_p90_ms", stats.Percentile(first, 0.9))
	if len(first) > 0 {
		put("resume.first_task_max_ms", slices.Max(first))
	}
	for _, mode := range b.o.modes {
		put("resume."+mode+".first_task_p50_ms", stats.Percentile(pick(func(r round) float64 { return r.first }, mode), 0.5))
	}
	put("resume.running_seen_p50_ms", stats.Percentile(pick(func(r round) float64 { return r.running }, ""), 0.5))
	put("resume.pending_seen_p50_ms", stats.Percentile(pick(func(r round) float64 { return r.pending }, ""), 0.5))
	put("resume.ready_seen_p50_ms", stats.Percentile(pick(func(r round) float64 { return r.ready }, ""), 0.5))
	put("resume.restore_p50_ms", stats.Percentile(pick(func(r round) float64 { return r.restore }, ""), 0.5))
	put("resume.suspend_p50_ms", stats.Percentile(pick(func(r round) float64 { return r.suspend }, ""), 0.5))
	put("resume.snapshot_p50_ms", stats.Percentile(pick(func(r round) float64 { return r.snapshot }, ""), 0.5))
	put("resume.release_p50_ms", stats.Percentile(pick(func(r round) float64 { return r.release }, ""), 0.5))
	put("resume.rounds", float64(len(first)))
	put("resume.data_mib", float64(b.dataBytes)/(1<<20))
	put("resume.archive_mib", float64(b.archive)/(1<<20))
	put("resume.load_start", load1m(load0))
	put("resume.load_end", load1m(load1))
	return m
}

func msSince(start, t time.Time) float64 { return float64(t.Sub(start)) / float64(time.Millisecond) }

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// load1m is the 1-minute figure of a loadAvg string, NaN when unknown.
func load1m(s string) float64 {
	v, err := strconv.ParseFloat(strings.Fields(s + " x")[0], 64)
	if err != nil {
		return math.NaN()
	}
	return v
}
