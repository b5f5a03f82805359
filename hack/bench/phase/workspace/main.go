// Package workspace is the workspace phase of hack/bench (formerly
// hack/bench-workspace). It measures what idle workspaces cost one agent:
// it starts an agent server in this process at the tenant isolation
// level, with the agent's default disk quota (--task-disk-size 10Gi:
// each workspace a sparse ext4 image on a loop device, mounted) on a
// temporary state directory, creates -n workspaces through the
// Workspaces service (gRPC over loopback with mTLS, as the controller
// does), one after the other, and prints one table per network:
//
//   - the latency of each EnsureWorkspace (p50, p99, max);
//   - this process's resident memory (VmRSS, VmHWM) and the Go heap in
//     use after a collection, before the workspaces and with all of them,
//     and the difference per workspace;
//   - the kernel's memory (/proc/meminfo Slab, SUnreclaim, Percpu,
//     KernelStack) before and with the workspaces: node-wide figures, so
//     what other work on the node does in the meantime is in them;
//   - the node's disk: the blocks the state directory's files take (what
//     du counts), against their apparent size;
//   - the loop devices, mounts, network devices and task UIDs in use;
//   - the time to delete them all, and what is left afterwards (nothing,
//     or the run fails).
//
// The limits that bite at that count are printed first: max_loop and the
// loop devices that exist, fs.mount-max against the mounts of this mount
// namespace, fs.inotify.max_user_instances, the free disk, the task UID
// range and (with Egress) the address slots. It must run as root on a
// node with cgroup v2, loop devices and mkfs.ext4; -networks None,Egress
// adds a run with a veth pair per workspace.
//
// After each network's run comes an image run (-image, -image-n; see
// image.go): workspaces without an image and in one image, made in turn,
// and what those in the image cost beyond the image's one copy.
//
// The tenant level starts the shim the agent ships: bashtask-shim, built
// from this tree into the temporary directory.
//
// The phase runs in a child of this binary (-workspace-child as its first
// argument, see ChildMain) in a mount namespace of its own; the child
// prints the tables and hands the figures back in a file.
package workspace

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/metrics"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	// The agent's default bucket, file://<state dir>/uploads.
	_ "gocloud.dev/blob/fileblob"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	agentv1 "github.com/bashtask/bashtask-operator/api/agent/v1"
	"github.com/bashtask/bashtask-operator/executor"
	"github.com/bashtask/bashtask-operator/executor/agent"
	"github.com/bashtask/bashtask-operator/hack/bench/phase"
	"github.com/bashtask/bashtask-operator/hack/bench/report"
	"github.com/bashtask/bashtask-operator/hack/bench/stats"
	"github.com/bashtask/bashtask-operator/internal/procfs"
	"github.com/bashtask/bashtask-operator/internal/rig/nodeimages"
	"github.com/bashtask/bashtask-operator/internal/rig/testshim"
	"github.com/bashtask/bashtask-operator/internal/tlsutil"
)

// Phase is the workspace phase.
type Phase struct {
	n        int
	networks string
	sizeGiB  int64
	dir      string
	image    string
	imageN   int
}

// Name is "workspace".
func (*Phase) Name() string { return "workspace" }

// Flags registers the flags of the former hack/bench-workspace.
func (p *Phase) Flags(fs *flag.FlagSet) {
	fs.IntVar(&p.n, "n", 1000, "workspaces to create")
	fs.StringVar(&p.networks, "networks", "None", "comma-separated networks to run with, one run each: None, Egress")
	fs.Int64Var(&p.sizeGiB, "size-gib", 10, "each workspace's file system in GiB (the agent's --task-disk-size)")
	fs.StringVar(&p.dir, "dir", "", "parent of the temporary state directory; its file system holds the images (default: $TMPDIR)")
	fs.StringVar(&p.image, "image", string(nodeimages.TaskSmall), "task image of the image run (task-small, or task: Debian, cached in bin/images after its first build)")
	fs.IntVar(&p.imageN, "image-n", 200, "workspaces of the image run, after each network's run: as many without an image, then in one image; 0 skips it")
}

// Run runs the phase in a child of this binary in a mount namespace of
// its own, and returns the figures it hands back.
func (p *Phase) Run(ctx context.Context, _ *phase.Env) (phase.Figures, error) {
	// The agent runs in a mount namespace of its own, as in its pod: a
	// process elsewhere on the node that makes a mount namespace of its
	// own while a workspace is mounted (a test's, another agent's shim)
	// would otherwise hold a copy of its file system, and its deletion
	// would wait for that process.
	out, err := os.CreateTemp("", "bench-workspace-figures-")
	if err != nil {
		return nil, err
	}
	_ = out.Close()
	defer os.Remove(out.Name())
	cmd := exec.CommandContext(ctx, "/proc/self/exe", ChildFlag, "-n", strconv.Itoa(p.n), "-networks", p.networks,
		"-size-gib", strconv.FormatInt(p.sizeGiB, 10), "-dir", p.dir, "-image", p.image, "-image-n", strconv.Itoa(p.imageN), "-figures", out.Name())
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWNS, Pdeathsig: syscall.SIGTERM}
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("the workspace phase's child: %w", err)
	}
	raw, err := os.ReadFile(out.Name())
	if err != nil {
		return nil, err
	}
	f := phase.Figures{}
	if err := json.Unmarshal(raw, &f); err != nil {
		return nil, fmt.Errorf("the workspace phase's figures: %w", err)
	}
	return f, nil
}

// ChildFlag is the first argument that makes this binary run the phase in
// its own process (ChildMain).
const ChildFlag = "-workspace-child"

// ChildMain runs the phase when os.Args[1] is ChildFlag (this binary
// re-executed by Run in a mount namespace of its own) and exits; otherwise
// it returns.
func ChildMain() {
	if len(os.Args) < 2 || os.Args[1] != ChildFlag {
		return
	}
	var p Phase
	fs := flag.NewFlagSet(ChildFlag, flag.ExitOnError)
	p.Flags(fs)
	figuresOut := fs.String("figures", "", "write the figures to this JSON file")
	_ = fs.Parse(os.Args[2:])
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		fmt.Fprintln(os.Stderr, "bench workspace: making the mounts private:", err)
		os.Exit(1)
	}
	if err := run(&p, strings.Split(p.networks, ","), *figuresOut); err != nil {
		fmt.Fprintln(os.Stderr, "bench workspace:", err)
		os.Exit(1)
	}
	os.Exit(0)
}

func run(p *Phase, networks []string, jsonOut string) error {
	n, size, parent := p.n, p.sizeGiB<<30, p.dir
	if os.Geteuid() != 0 {
		return errors.New("needs root: loop devices, mounts, network namespaces and task UIDs")
	}
	if _, err := os.Stat("/dev/loop-control"); err != nil {
		return fmt.Errorf("needs loop devices: %w", err)
	}
	top, err := os.MkdirTemp(parent, "bench-workspace-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(top)
	shimPath, err := testshim.Build(top)
	if err != nil {
		return fmt.Errorf("bashtask-shim (run from the repository): %w", err)
	}
	printLimits(os.Stdout, n, top, networks)
	figures := map[string]float64{}
	for _, network := range networks {
		r, err := runNetwork(n, network, size, top, shimPath)
		if err != nil {
			return fmt.Errorf("network %s: %w", network, err)
		}
		r.print(os.Stdout)
		r.addFigures(figures)
	}
	if p.imageN > 0 {
		if err := runImages(p, networks, size, top, shimPath, figures); err != nil {
			return err
		}
	}
	if jsonOut != "" {
		b, err := json.MarshalIndent(figures, "", "  ")
		if err != nil {
			return err
		}
		return os.WriteFile(jsonOut, append(b, '\n'), 0o644)
	}
	return nil
}

// sample is what is measured before and with the workspaces.
type sample struct {
	rssKB, hwmKB    int64 // this process's VmRSS and VmHWM
	heapBytes       int64 // Go heap objects after a collection
	meminfo         map[string]int64
	diskBytes       int64 // blocks of the state directory's files
	apparentBytes   int64 // their sizes
	loops, mounts   int   // loop devices backed by workspace images, mounts of workspaces
	links, goroutes int   // network devices of the agent's namespace, goroutines
}

// result is one run's figures.
type result struct {
	network        string
	n              int
	size           int64
	create, delete []time.Duration
	deleteAll      time.Duration
	before, with   sample
	left           sample // after the deletion
}

// runNetwork starts an agent, creates n workspaces of network, measures,
// deletes them and stops the agent, which must leave nothing behind.
func runNetwork(n int, network string, size int64, top, shimPath string) (_ *result, err error) {
	dir, err := os.MkdirTemp(top, "run-"+strings.ToLower(network)+"-")
	if err != nil {
		return nil, err
	}
	cfg := agentConfig(n, network, size, dir, shimPath)
	state, work := cfg.StateDir, cfg.Executor.WorkDirRoot
	if err := os.Mkdir(work, 0o755); err != nil {
		return nil, err
	}
	a, err := startAgent(cfg, dir)
	if err != nil {
		return nil, err
	}
	defer func() {
		if cerr := a.stop(); err == nil {
			err = cerr
		}
	}()
	return createDelete(a, n, network, size, state, work)
}

// agentConfig is the agent of a run: the tenant level, room for n
// workspaces, state and work directories under dir.
func agentConfig(n int, network string, size int64, dir, shimPath string) agent.Config {
	state, work := filepath.Join(dir, "state"), filepath.Join(dir, "work")
	pid := os.Getpid()
	cfg := agent.Config{
		NodeName:        "bench",
		PodName:         "bench-workspace",
		StateDir:        state,
		TaskUIDs:        agent.UIDRange{First: 2400000, Last: 2400000 + uint32(n) + 63},
		Logger:          slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
		TaskNetwork:     executor.NetworkNone,
		AllowedNetworks: []executor.Network{executor.NetworkNone, executor.NetworkEgress},
		MaxWorkspaces:   n,
		Executor: executor.Config{
			Isolation:         executor.IsolationTenant,
			CgroupParent:      fmt.Sprintf("bashtask-bench-workspace-%d", pid),
			WorkDirRoot:       work,
			ShimPath:          shimPath,
			DiskQuotaBytes:    size,
			DiskQuotaCapBytes: size,
		},
	}
	if strings.EqualFold(network, string(executor.NetworkEgress)) {
		// A range and an ID of this process's own, so that an agent or
		// another benchmark on the host is not disturbed: a /19, 2048
		// slots of a /30 each.
		cfg.Executor.Egress = &executor.EgressConfig{ID: fmt.Sprintf("w%x", pid%(1<<24)),
			CIDR: fmt.Sprintf("100.%d.%d.0/19", 64+(pid>>3)%64, (pid%8)*32)}
	}
	return cfg
}

// createDelete creates n workspaces of network on a, measures, and
// deletes them, which must leave nothing behind.
func createDelete(a *runningAgent, n int, network string, size int64, state, work string) (*result, error) {
	r := &result{network: network, n: n, size: size}
	ctx := context.Background()
	// The connection is made with the first call: before the first
	// sample, so that its goroutines and buffers are in the baseline.
	if _, err := a.ws.ListWorkspaces(ctx, &agentv1.ListWorkspacesRequest{}); err != nil {
		return nil, err
	}
	r.before = measure(state, work)
	uids := make([]string, n)
	// Whatever fails half-way, what was made is deleted.
	defer func() {
		for _, uid := range uids {
			if uid != "" {
				_, _ = a.ws.DeleteWorkspace(ctx, &agentv1.DeleteWorkspaceRequest{Uid: uid})
			}
		}
	}()
	for i := range n {
		uid := fmt.Sprintf("bench-%d-%04d", os.Getpid(), i)
		begin := time.Now()
		resp, err := a.ws.EnsureWorkspace(ctx, &agentv1.EnsureWorkspaceRequest{Spec: &agentv1.WorkspaceSpec{
			Ref:     &agentv1.WorkspaceRef{Namespace: "bench", Name: fmt.Sprintf("ws-%04d", i), Uid: uid},
			Network: network, CarryWorkingDir: true,
		}})
		if err != nil {
			return nil, fmt.Errorf("workspace %d: %w", i, err)
		}
		r.create = append(r.create, time.Since(begin))
		uids[i] = uid
		if st := resp.GetStatus(); !st.GetStorageEnforced() || st.GetCapacityBytes() != size {
			return nil, fmt.Errorf("workspace %d has no file system of %d bytes: %v", i, size, st)
		}
	}
	r.with = measure(state, work)
	begin := time.Now()
	for i, uid := range uids {
		t := time.Now()
		if _, err := a.ws.DeleteWorkspace(ctx, &agentv1.DeleteWorkspaceRequest{Uid: uid}); err != nil {
			return nil, fmt.Errorf("deleting workspace %d: %w", i, err)
		}
		r.delete = append(r.delete, time.Since(t))
		uids[i] = ""
	}
	r.deleteAll = time.Since(begin)
	r.left = measure(state, work)
	if r.left.loops != 0 || r.left.mounts != 0 {
		return nil, fmt.Errorf("after the deletion %d loop devices and %d mounts are left", r.left.loops, r.left.mounts)
	}
	return r, nil
}

// runningAgent is an agent server of this process and a Workspaces
// client of it.
type runningAgent struct {
	srv  *agent.Server
	ws   agentv1.WorkspacesClient
	stop func() error
}

// startAgent starts the server of cfg on loopback with mTLS (certificates
// in dir) and waits until it is ready.
func startAgent(cfg agent.Config, dir string) (*runningAgent, error) {
	ca, err := tlsutil.NewCA("bench-ca", time.Hour)
	if err != nil {
		return nil, err
	}
	caFile := filepath.Join(dir, "ca.crt")
	if err := tlsutil.WriteFileAtomic(caFile, ca.CertPEM, 0o600); err != nil {
		return nil, err
	}
	files := func(leaf tlsutil.LeafOptions, name string) (*tlsutil.Files, error) {
		kp, err := ca.Issue(leaf)
		if err != nil {
			return nil, err
		}
		cf, kf, err := kp.WriteFiles(dir, name)
		if err != nil {
			return nil, err
		}
		return tlsutil.NewFiles(cf, kf, caFile)
	}
	serverFiles, err := files(tlsutil.LeafOptions{CommonName: "agent", IPs: []net.IP{net.IPv4(127, 0, 0, 1)}, Server: true}, "server")
	if err != nil {
		return nil, err
	}
	clientFiles, err := files(tlsutil.LeafOptions{CommonName: "bashtask-controller", Client: true}, "client")
	if err != nil {
		return nil, err
	}
	cfg.CertCheck = serverFiles.Check
	ctx, cancel := context.WithCancel(context.Background())
	srv, err := agent.New(ctx, cfg)
	if err != nil {
		cancel()
		return nil, err
	}
	serverTLS, err := tlsutil.ServerConfig(serverFiles, "bashtask-controller")
	if err != nil {
		cancel()
		return nil, errors.Join(err, srv.Close())
	}
	g := grpc.NewServer(grpc.Creds(credentials.NewTLS(serverTLS)))
	srv.Register(g)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		cancel()
		return nil, errors.Join(err, srv.Close())
	}
	runDone := make(chan error, 1)
	go func() { runDone <- srv.Run(ctx) }()
	go func() { _ = g.Serve(lis) }()
	stop := func() error {
		cancel()
		err := <-runDone
		g.Stop()
		return errors.Join(err, srv.Close())
	}
	clientTLS, err := tlsutil.ClientConfig(clientFiles, "127.0.0.1")
	if err != nil {
		return nil, errors.Join(err, stop())
	}
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(credentials.NewTLS(clientTLS)))
	if err != nil {
		return nil, errors.Join(err, stop())
	}
	a := &runningAgent{srv: srv, ws: agentv1.NewWorkspacesClient(conn), stop: func() error { conn.Close(); return stop() }}
	deadline := time.Now().Add(time.Minute)
	for {
		ready, problems := srv.Readiness()
		if ready {
			return a, nil
		}
		if time.Now().After(deadline) {
			return nil, errors.Join(fmt.Errorf("the agent is not ready: %s", strings.Join(problems, "; ")), a.stop())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// measure takes a sample: this process's memory, the kernel's, the
// state directory's disk use and what the workspaces hold.
func measure(state, work string) sample {
	runtime.GC()
	s := sample{meminfo: readMeminfo(), goroutes: runtime.NumGoroutine()}
	if m, err := procfs.ReadMemory(os.Getpid()); err == nil {
		s.rssKB, s.hwmKB = m.RSS>>10, m.HWM>>10
	}
	ms := []metrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}}
	metrics.Read(ms)
	s.heapBytes = int64(ms[0].Value.Uint64())
	_ = filepath.WalkDir(state, func(_ string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() && d.Type()&fs.ModeSymlink != 0 {
			return nil
		}
		fi, err := d.Info()
		if err != nil {
			return nil
		}
		if st, ok := fi.Sys().(*syscall.Stat_t); ok {
			s.diskBytes += st.Blocks * 512
		}
		if fi.Mode().IsRegular() {
			s.apparentBytes += fi.Size()
		}
		return nil
	})
	devs, _ := filepath.Glob("/sys/block/loop*/loop/backing_file")
	for _, f := range devs {
		if b, err := os.ReadFile(f); err == nil && strings.HasPrefix(string(b), filepath.Join(state, "workspaces")+"/") {
			s.loops++
		}
	}
	if b, err := os.ReadFile("/proc/self/mountinfo"); err == nil {
		for line := range strings.Lines(string(b)) {
			if f := strings.Fields(line); len(f) > 4 && strings.HasPrefix(f[4], filepath.Join(work, "workspaces")+"/") {
				s.mounts++
			}
		}
	}
	if links, err := os.ReadDir("/sys/class/net"); err == nil {
		s.links = len(links)
	}
	return s
}

// readMeminfo reads the kernel memory fields of /proc/meminfo, in KiB.
func readMeminfo() map[string]int64 {
	return fieldKB("/proc/meminfo", "Slab", "SUnreclaim", "Percpu", "KernelStack", "MemAvailable")
}

// fieldKB reads "Name: N kB" lines of file.
func fieldKB(file string, names ...string) map[string]int64 {
	out := map[string]int64{}
	f, err := os.Open(file)
	if err != nil {
		return out
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		name, rest, ok := strings.Cut(sc.Text(), ":")
		if !ok || !slices.Contains(names, name) {
			continue
		}
		if v, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64); err == nil {
			out[name] = v
		}
	}
	return out
}

// printLimits prints the node's limits that a thousand workspaces meet.
func printLimits(w io.Writer, n int, top string, networks []string) {
	read := func(path string) string {
		b, err := os.ReadFile(path)
		if err != nil {
			return "unknown (" + err.Error() + ")"
		}
		return strings.TrimSpace(string(b))
	}
	loops, _ := filepath.Glob("/sys/block/loop*")
	mounts := 0
	if b, err := os.ReadFile("/proc/self/mountinfo"); err == nil {
		mounts = strings.Count(string(b), "\n")
	}
	var st syscall.Statfs_t
	free := "unknown"
	if syscall.Statfs(top, &st) == nil {
		free = fmt.Sprintf("%.1f GiB", float64(st.Bavail)*float64(st.Bsize)/(1<<30))
	}
	fmt.Fprintf(w, "limits for %d workspaces, each a loop device, a mount and a network namespace:\n", n)
	fmt.Fprintf(w, "  loop: max_loop %s (not a bound unless set at boot; /dev/loop-control makes devices on demand), %d devices exist\n",
		read("/sys/module/loop/parameters/max_loop"), len(loops))
	fmt.Fprintf(w, "  fs.mount-max %s per mount namespace, %d mounts in this one (the tasks' namespaces detach the workspaces)\n", read("/proc/sys/fs/mount-max"), mounts)
	fmt.Fprintf(w, "  fs.inotify.max_user_instances %s (the agent watches no workspace)\n", read("/proc/sys/fs/inotify/max_user_instances"))
	fmt.Fprintf(w, "  free disk under %s: %s\n", top, free)
	fmt.Fprintf(w, "  task UIDs: --task-uid-range %s holds %d, one per workspace for its life and one per running task\n",
		agent.DefaultTaskUIDRange, agent.DefaultTaskUIDRange.Last-agent.DefaultTaskUIDRange.First+1)
	if slices.ContainsFunc(networks, func(n string) bool { return strings.EqualFold(n, string(executor.NetworkEgress)) }) {
		fmt.Fprintf(w, "  Egress: --egress-cidr %s holds %d slots of a /30, one per Egress workspace and one per running Egress task\n",
			executor.DefaultEgressCIDR, 1<<(32-16-2))
	}
	fmt.Fprintln(w)
}

func (r *result) print(w io.Writer) {
	tw := report.NewTable(w, true)
	per := func(a, b int64) string { return fmt.Sprintf("%.1f", float64(b-a)/float64(r.n)) }
	fmt.Fprintf(tw, "%d workspaces, network %s, %d GiB file system each\tbefore\twith them\tper workspace\t\n", r.n, r.network, r.size>>30)
	fmt.Fprintf(tw, "create (EnsureWorkspace), p50 / p99 / max\t\t%v / %v / %v\t\t\n", pct(r.create, 50), pct(r.create, 99), slices.Max(r.create).Round(10*time.Microsecond))
	fmt.Fprintf(tw, "agent process VmRSS, MiB (KiB per workspace)\t%.1f\t%.1f\t%s\t\n", mib(r.before.rssKB), mib(r.with.rssKB), per(r.before.rssKB, r.with.rssKB))
	fmt.Fprintf(tw, "agent process VmHWM, MiB\t%.1f\t%.1f\t\t\n", mib(r.before.hwmKB), mib(r.with.hwmKB))
	fmt.Fprintf(tw, "Go heap objects after GC, MiB (KiB per workspace)\t%.1f\t%.1f\t%.1f\t\n",
		float64(r.before.heapBytes)/(1<<20), float64(r.with.heapBytes)/(1<<20), float64(r.with.heapBytes-r.before.heapBytes)/1024/float64(r.n))
	fmt.Fprintf(tw, "goroutines\t%d\t%d\t\t\n", r.before.goroutes, r.with.goroutes)
	for _, k := range []string{"Slab", "SUnreclaim", "Percpu", "KernelStack"} {
		fmt.Fprintf(tw, "node %s, MiB (KiB per workspace; node-wide)\t%.1f\t%.1f\t%s\t\n", k, mib(r.before.meminfo[k]), mib(r.with.meminfo[k]), per(r.before.meminfo[k], r.with.meminfo[k]))
	}
	fmt.Fprintf(tw, "node MemAvailable, MiB (KiB per workspace; node-wide)\t%.1f\t%.1f\t%s\t\n",
		mib(r.before.meminfo["MemAvailable"]), mib(r.with.meminfo["MemAvailable"]), per(r.with.meminfo["MemAvailable"], r.before.meminfo["MemAvailable"]))
	fmt.Fprintf(tw, "disk of the state directory (allocated blocks), MiB\t%.1f\t%.1f\t%.2f\t\n",
		float64(r.before.diskBytes)/(1<<20), float64(r.with.diskBytes)/(1<<20), float64(r.with.diskBytes-r.before.diskBytes)/(1<<20)/float64(r.n))
	fmt.Fprintf(tw, "apparent size of its files, GiB\t%.1f\t%.1f\t\t\n", float64(r.before.apparentBytes)/(1<<30), float64(r.with.apparentBytes)/(1<<30))
	fmt.Fprintf(tw, "loop devices / mounts of the workspaces\t%d / %d\t%d / %d\t\t\n", r.before.loops, r.before.mounts, r.with.loops, r.with.mounts)
	fmt.Fprintf(tw, "network devices of the agent's namespace\t%d\t%d\t\t\n", r.before.links, r.with.links)
	fmt.Fprintf(tw, "delete (DeleteWorkspace), p50 / p99; all %d one after the other\t\t%v / %v; %v\t\t\n", r.n, pct(r.delete, 50), pct(r.delete, 99), r.deleteAll.Round(time.Millisecond))
	fmt.Fprintf(tw, "left after the deletion: loop devices / mounts, network devices\t\t%d / %d, %d\t\t\n", r.left.loops, r.left.mounts, r.left.links)
	_ = tw.Flush()
	fmt.Fprintln(w)
}

func (r *result) addFigures(m map[string]float64) {
	p := "workspaces." + strings.ToLower(r.network) + "."
	ms := func(d time.Duration) float64 { return round(float64(d) / float64(time.Millisecond)) }
	m[p+"create_p50_ms"] = ms(pct(r.create, 50))
	m[p+"create_p99_ms"] = ms(pct(r.create, 99))
	m[p+"rss_kib_per_workspace"] = round(float64(r.with.rssKB-r.before.rssKB) / float64(r.n))
	m[p+"heap_kib_per_workspace"] = round(float64(r.with.heapBytes-r.before.heapBytes) / 1024 / float64(r.n))
	m[p+"slab_kib_per_workspace"] = round(float64(r.with.meminfo["Slab"]-r.before.meminfo["Slab"]) / float64(r.n))
	m[p+"disk_mib_per_workspace"] = round(float64(r.with.diskBytes-r.before.diskBytes) / (1 << 20) / float64(r.n))
	m[p+"delete_all_s"] = round(r.deleteAll.Seconds())
}

// pct is the p-th percentile of d (stats.PercentileDuration), rounded to
// 10µs.
func pct(d []time.Duration, p int) time.Duration {
	return stats.PercentileDuration(d, float64(p)/100).Round(10 * time.Microsecond)
}

func mib(kb int64) float64 { return float64(kb) / 1024 }

func round(f float64) float64 { return float64(int64(f*100+0.5)) / 100 }
