// Package fork is the fork phase of hack/bench: how long a fork of a
// BashWorkspace takes on the source's node, from the Go client's Fork
// until every copy is Ready (docs/workspaces.md, "Forking a workspace"),
// against `cp -a` of the same tree on the same disk.
//
// On the shared local cluster (the tenant level, so root), it creates a
// workspace and fills it through a task with -files files holding -mib
// MiB of random bytes in 40 directories. Then -rounds rounds, each of
// one fork (one copy) and of -count copies at once, the copies deleted
// after each; the figure of a round is the wall time of Fork with its
// wait. Last, -rounds runs of `cp -a` of the workspace's tree, read
// from its mount on the node, to a directory beside the agents' state on
// the same file system, each followed by a sync, and removed after.
// Targets: p50 <= 250 ms for one copy and <= 1.5 s for 8 at once.
package fork

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/utils/ptr"

	v1 "github.com/bashtask/bashtask-operator/api/v1alpha1"
	btclient "github.com/bashtask/bashtask-operator/client"
	"github.com/bashtask/bashtask-operator/hack/bench/phase"
	"github.com/bashtask/bashtask-operator/hack/bench/stats"
)

const (
	namespace = "bench-fork"
	source    = "src"
	// targetOneMs and targetManyMs are the targets of the p50s, in
	// milliseconds.
	targetOneMs, targetManyMs = 250, 1500
)

// Phase is the fork phase.
type Phase struct {
	rounds, count, files, mib int
	timeout                   time.Duration
}

// Name is "fork".
func (*Phase) Name() string { return "fork" }

// Flags registers the phase's flags.
func (p *Phase) Flags(fs *flag.FlagSet) {
	fs.IntVar(&p.rounds, "rounds", 10, "rounds of each measure (one copy, -count copies, cp -a)")
	fs.IntVar(&p.count, "count", 8, "copies of the many-at-once fork")
	fs.IntVar(&p.files, "files", 2000, "files of the source workspace")
	fs.IntVar(&p.mib, "mib", 100, "MiB the source's files hold in all")
	fs.DurationVar(&p.timeout, "step-timeout", 3*time.Minute, "longest wait for one step")
}

// Run measures and prints the fork's rounds and table.
func (p *Phase) Run(ctx context.Context, env *phase.Env) (phase.Figures, error) {
	if os.Geteuid() != 0 {
		return nil, fmt.Errorf("run as root: workspaces need agents at the tenant isolation level (euid %d)", os.Geteuid())
	}
	if p.rounds < 1 || p.count < 1 || p.files < 1 {
		return nil, errors.New("-rounds, -count and -files must be at least 1")
	}
	c, err := env.Cluster(ctx)
	if err != nil {
		return nil, err
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", c.Kubeconfig)
	if err != nil {
		return nil, err
	}
	cfg.QPS, cfg.Burst = 100, 200
	bc, err := btclient.New(cfg)
	if err != nil {
		return nil, err
	}
	k, err := phase.NewClient(cfg)
	if err != nil {
		return nil, err
	}
	if err := k.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace}}); err != nil && !apierrors.IsAlreadyExists(err) {
		return nil, err
	}
	b := &bench{p: p, bc: bc, dir: c.Dir}
	defer b.cleanup()
	if err := b.prepare(ctx); err != nil {
		return nil, err
	}
	return b.measure(ctx)
}

// bench is one run of the phase.
type bench struct {
	p   *Phase
	bc  *btclient.Client
	dir string
	src *v1.BashWorkspace
}

// prepare makes the filled source.
func (b *bench) prepare(ctx context.Context) error {
	if _, err := b.bc.CreateWorkspace(ctx, btclient.WorkspaceOptions{Namespace: namespace, Name: source, CarryEnvironment: true}); err != nil {
		return err
	}
	wctx, cancel := context.WithTimeout(ctx, b.p.timeout)
	defer cancel()
	src, err := b.bc.WaitWorkspaceReady(wctx, namespace, source)
	if err != nil {
		return err
	}
	per := int64(b.p.mib) << 20 / int64(b.p.files)
	fill := fmt.Sprintf(`mkdir -p tree && cd tree && for d in $(seq 0 39); do mkdir -p d$d; done && `+
		`for i in $(seq 1 %d); do head -c %d /dev/urandom > d$((i %% 40))/f$i; done && export FILLED=1 && du -sm . | cut -f1`, b.p.files, per)
	res, err := b.bc.Run(wctx, btclient.RunOptions{Namespace: namespace, Workspace: source, Command: fill, Timeout: b.p.timeout})
	if err != nil {
		return fmt.Errorf("the fill: %w", err)
	}
	if res.ExitCode != 0 {
		return fmt.Errorf("the fill: exit %d: %s", res.ExitCode, res.Message)
	}
	b.src = src
	fmt.Printf("machine: %d CPUs, load average %s\nsource %s/%s on %s: %d files, %d MiB\n", runtime.NumCPU(), phase.LoadAvg(),
		namespace, source, ptr.Deref(src.Status.NodeName, "?"), b.p.files, b.p.mib)
	return nil
}

// measure runs the rounds and prints the table.
func (b *bench) measure(ctx context.Context) (phase.Figures, error) {
	var one, many, cp []time.Duration
	var frozen []float64
	for i := range b.p.rounds {
		d, fz, err := b.fork(ctx, 1)
		if err != nil {
			return nil, fmt.Errorf("round %d, one copy: %w", i+1, err)
		}
		one, frozen = append(one, d), append(frozen, fz...)
		d, fz, err = b.fork(ctx, b.p.count)
		if err != nil {
			return nil, fmt.Errorf("round %d, %d copies: %w", i+1, b.p.count, err)
		}
		many, frozen = append(many, d), append(frozen, fz...)
		if d, err = b.copyTree(); err != nil {
			return nil, fmt.Errorf("round %d, cp -a: %w", i+1, err)
		}
		cp = append(cp, d)
		fmt.Printf("round %2d: fork 1 %6s   fork %d %6s   cp -a %6s\n", i+1, one[i].Round(time.Millisecond), b.p.count,
			many[i].Round(time.Millisecond), cp[i].Round(time.Millisecond))
	}
	ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
	f := phase.Figures{
		"fork.one_p50_ms": ms(stats.MedianDuration(one)), "fork.one_p90_ms": ms(stats.PercentileDuration(one, 90)),
		"fork.many_p50_ms": ms(stats.MedianDuration(many)), "fork.many_p90_ms": ms(stats.PercentileDuration(many, 90)),
		"fork.many_count": float64(b.p.count), "fork.cp_p50_ms": ms(stats.MedianDuration(cp)),
		"fork.frozen_p50_ms": stats.Median(frozen) / 1000, "fork.frozen_max_ms": stats.Percentile(frozen, 100) / 1000,
	}
	fmt.Printf("\n%-34s %8s %8s %8s\n", "until Ready", "p50", "p90", "target")
	fmt.Printf("%-34s %6.0fms %6.0fms %6dms\n", "fork, 1 copy", f["fork.one_p50_ms"], f["fork.one_p90_ms"], targetOneMs)
	fmt.Printf("%-34s %6.0fms %6.0fms %6dms\n", fmt.Sprintf("fork, %d copies at once (all)", b.p.count), f["fork.many_p50_ms"], f["fork.many_p90_ms"], targetManyMs)
	fmt.Printf("%-34s %6.0fms %6.0fms\n", "cp -a of the same tree, + sync", f["fork.cp_p50_ms"], ms(stats.PercentileDuration(cp, 90)))
	fmt.Printf("%-34s %6.1fms (max %.1fms)\n", "source frozen per copy", f["fork.frozen_p50_ms"], f["fork.frozen_max_ms"])
	return f, nil
}

// fork makes n copies with the client's Fork, waits for them, and
// deletes them; it returns Fork's wall time and each copy's freeze in
// microseconds.
func (b *bench) fork(ctx context.Context, n int) (time.Duration, []float64, error) {
	wctx, cancel := context.WithTimeout(ctx, b.p.timeout)
	defer cancel()
	start := time.Now()
	forks, err := b.bc.Fork(wctx, btclient.ForkOptions{Namespace: namespace, Source: source, Count: n})
	took := time.Since(start)
	var frozen []float64
	for _, ws := range forks {
		if f := ws.Status.ForkedFrom; f != nil {
			frozen = append(frozen, float64(ptr.Deref(f.FrozenMicroseconds, 0)))
		}
	}
	for _, ws := range forks {
		if derr := b.bc.DeleteWorkspace(wctx, ws.Namespace, ws.Name); derr != nil && err == nil {
			err = derr
		}
	}
	return took, frozen, err
}

// copyTree times cp -a of the source's tree, read from its mount on the
// node, to a directory on the same file system as the agents' state,
// and a sync; the copy is removed after.
func (b *bench) copyTree() (time.Duration, error) {
	from, err := mountOf(string(b.src.UID))
	if err != nil {
		return 0, err
	}
	to := filepath.Join(b.dir, "cp-a")
	defer os.RemoveAll(to)
	start := time.Now()
	if out, err := exec.Command("cp", "-a", filepath.Join(from, "tree"), to).CombinedOutput(); err != nil {
		return 0, fmt.Errorf("cp -a: %w: %s", err, out)
	}
	if out, err := exec.Command("sync", "-f", to).CombinedOutput(); err != nil {
		return 0, fmt.Errorf("sync: %w: %s", err, out)
	}
	return time.Since(start), nil
}

// mountOf is where workspace uid's file system is mounted on this host.
func mountOf(uid string) (string, error) {
	b, err := os.ReadFile("/proc/self/mounts")
	if err != nil {
		return "", err
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if f := strings.Fields(line); len(f) > 1 && strings.HasSuffix(f[1], "/workspaces/"+uid) {
			return f[1], nil
		}
	}
	return "", fmt.Errorf("no mount of workspace %s on this host", uid)
}

// cleanup deletes the source.
func (b *bench) cleanup() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_ = b.bc.DeleteWorkspace(ctx, namespace, source)
}
