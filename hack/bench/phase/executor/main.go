// Package executor is the executor phase of hack/bench (formerly
// hack/bench-executor). It measures the executor against plain process
// creation and a plain file write, and prints one table:
//
//   - the median wall time of `true` run as a task, against a plain
//     fork/exec of the same `<shell> -c true` with the same environment
//     through os/exec, without and with cgroups; both sides start the
//     shell, wait for its exit and read its stdout and stderr to EOF;
//   - for reference, the same plain fork/exec in a new session, the one
//     process attribute of a task whose cost is the kernel's scheduler's
//     and not the executor's;
//   - the throughput of 2 GB of stdout through the executor (the command
//     is [producer]), against the same command's output written to a file
//     on the same disk, and against a
//     plain pipe drain of the same command, with SHA-256's own speed on one
//     core for reference (the executor hashes every byte in order);
//   - the same 2 GB against SHA-256 on one core, in -stream-rounds rounds
//     that run, in a random order each, SHA-256 alone, the task, and the
//     task with a reader that follows its spill file and uploads it in
//     8 MiB parts to a file:// bucket (uploadParts, as the agent uploads a
//     running task's output): the median of each round's ratio, the
//     executor process's CPU per GB, and the load average;
//   - the peak RSS growth of a process running that 2 GB task;
//   - the start of `true` at the tenant isolation level (the task shim in
//     new namespaces, a UID of its own, Landlock and seccomp), with the
//     node's network and with a network namespace of its own (None), as
//     the median overhead over the plain fork/exec;
//   - the same start with a disk quota on the working directory, a file
//     system taken from the pool made ahead of tasks (10Gi) and one of
//     another size made on the start (1Gi), against the tenant start;
//   - the start of `true` in a workspace (network None, its directory
//     carried over), as the median of its differences to the tenant task
//     of network None and of network Node run in the same round, and the
//     time to make a workspace;
//   - the CPU time one task of `true` costs, at the cgroup (process) level,
//     at the tenant level and in a workspace: the task's own processes
//     (the shell, and at the tenant level its shim) and the executor's.
//
// The tenant level starts the shim the agent starts: bashtask-shim, built
// from this tree into a temporary directory as a static binary (-shim), unless -shim=self
// makes this binary the shim, as the agent's own binary is when no
// bashtask-shim lies beside it.
//
// The 2 GB task runs in a child process of this program (re-executed with
// -executor-child as its first argument, see ChildMain), so its peak RSS
// (VmHWM) and CPU are measured without the rest of the benchmark;
// -starts=false measures only the stream. The headline figures are the
// phase's JSON section.
package executor

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/bashtask/bashtask-operator/executor"
	"github.com/bashtask/bashtask-operator/hack/bench/phase"
	"github.com/bashtask/bashtask-operator/hack/bench/report"
	"github.com/bashtask/bashtask-operator/hack/bench/stats"
	"github.com/bashtask/bashtask-operator/internal/rig/testshim"
)

const streamBytes = 2_000_000_000

// Phase is the executor phase.
type Phase struct {
	iters, rounds       int
	dir, shell, shimBin string
	stream, starts      bool
}

// Name is "executor".
func (*Phase) Name() string { return "executor" }

// Flags registers the flags of the former hack/bench-executor.
func (p *Phase) Flags(fs *flag.FlagSet) {
	fs.IntVar(&p.iters, "n", 300, "tasks per start-overhead measurement")
	fs.StringVar(&p.dir, "dir", "", "directory for spill files and the plain write (default: a temporary directory)")
	fs.StringVar(&p.shell, "shell", executor.DefaultShell, "shell to run")
	fs.BoolVar(&p.stream, "stream", true, "also measure the 2 GB stream (throughput and memory)")
	fs.BoolVar(&p.starts, "starts", true, "measure task starts and their CPU (false: only the 2 GB stream)")
	fs.IntVar(&p.rounds, "stream-rounds", 8, "rounds of the 2 GB stream: each runs the executor without and with the part-upload reader and SHA-256 alone, in a random order")
	fs.StringVar(&p.shimBin, "shim", "", "the tenant level's shim binary: empty builds ./cmd/bashtask-shim from this tree; self is this binary")
}

// Run measures and prints the executor's table.
func (p *Phase) Run(context.Context, *phase.Env) (phase.Figures, error) {
	if !p.starts {
		return runStreamOnly(p.dir, p.shell, p.rounds)
	}
	return run(p.iters, p.dir, p.shell, p.shimBin, p.stream, p.rounds)
}

// ChildFlag is the first argument that makes this binary run the 2 GB task
// and report on stdout (ChildMain).
const ChildFlag = "-executor-child"

// ChildMain runs the 2 GB task as the child the phase re-executes this
// binary as, when os.Args[1] is ChildFlag, and exits; otherwise it returns.
func ChildMain() {
	if len(os.Args) < 2 || os.Args[1] != ChildFlag {
		return
	}
	fs := flag.NewFlagSet(ChildFlag, flag.ExitOnError)
	dir := fs.String("dir", "", "directory for the spill file")
	shell := fs.String("shell", executor.DefaultShell, "shell to run")
	uploads := fs.Bool("uploads", false, "follow the spill file with the part-upload reader")
	_ = fs.Parse(os.Args[2:])
	if err := runChild(*dir, *shell, *uploads); err != nil {
		fmt.Fprintln(os.Stderr, "bench executor child:", err)
		os.Exit(1)
	}
	os.Exit(0)
}

func run(iters int, dir, shell, shimBin string, stream bool, rounds int) (phase.Figures, error) {
	if dir == "" {
		d, err := os.MkdirTemp("", "bench-executor-")
		if err != nil {
			return nil, err
		}
		defer os.RemoveAll(d)
		dir = d
	}
	shimPath, err := shimBinary(shimBin, dir)
	if err != nil {
		return nil, err
	}
	// The plain baseline uses os/exec, so this process does not become a
	// subreaper (its reaper would take os/exec's statuses); the child that
	// runs the 2 GB task does, like the agent.
	noCg, err := executor.New(executor.Config{Shell: shell, Cgroups: executor.CgroupOff, WorkDirRoot: dir})
	if err != nil {
		return nil, err
	}
	withCg, err := executor.New(executor.Config{Shell: shell, Cgroups: executor.CgroupAuto, CgroupParent: fmt.Sprintf("bashtask-bench-%d", os.Getpid()), WorkDirRoot: dir})
	if err != nil {
		return nil, err
	}
	defer withCg.Close()
	// Network Egress with a task range and an ID of this process's own, so
	// that an agent or another benchmark on the host is not disturbed.
	pid := os.Getpid()
	egress := &executor.EgressConfig{ID: fmt.Sprintf("b%x", pid%(1<<24)),
		CIDR: fmt.Sprintf("100.%d.%d.0/24", 64+(pid>>8)%64, pid%256)}
	tenant, err := executor.New(executor.Config{Shell: shell, Cgroups: executor.CgroupAuto, CgroupParent: fmt.Sprintf("bashtask-bench-tenant-%d", os.Getpid()),
		WorkDirRoot: dir, Isolation: executor.IsolationTenant, ShimPath: shimPath, Egress: egress})
	if err != nil {
		return nil, err
	}
	defer tenant.Close()
	// The tenant level with a disk quota on each working directory (the
	// agent's --task-disk-size): the default size, taken from the pool of
	// file systems made ahead of tasks, and a size of the task's own,
	// made (mkfs.ext4, loop device, mount) on its start.
	images, err := os.MkdirTemp(dir, "disk-images-")
	if err != nil {
		return nil, err
	}
	tenantDisk, err := executor.New(executor.Config{Shell: shell, Cgroups: executor.CgroupAuto, CgroupParent: fmt.Sprintf("bashtask-bench-disk-%d", os.Getpid()),
		WorkDirRoot: dir, Isolation: executor.IsolationTenant, ShimPath: shimPath,
		DiskQuotaBytes: 10 << 30, DiskQuotaCapBytes: 20 << 30, DiskImageDir: images,
		// The agent's default network too, for the CPU of a task at the
		// agent's defaults: a range and an ID of its own beside tenant's.
		Egress: &executor.EgressConfig{ID: fmt.Sprintf("d%x", pid%(1<<24)), CIDR: fmt.Sprintf("100.%d.%d.0/24", 64+((pid>>8)+32)%64, pid%256)}})
	if err != nil {
		return nil, err
	}
	defer tenantDisk.Close()
	diskOK := tenantDisk.Capabilities().DiskQuota

	// The baseline gets the environment a task gets: bash starts measurably
	// slower with LANG=C.UTF-8 (it loads the locale), and that is the
	// shell's cost, not the executor's.
	env, err := executor.BuildEnv(executor.EnvOptions{Ambient: os.Environ()})
	if err != nil {
		return nil, err
	}

	// Interleave the variants round by round, each round in another
	// order, so that drift in the machine's load and whatever one run
	// leaves behind for the next (page cache, the scheduler's state, the
	// work a task leaves to the background: a file system unmounted, a
	// pool refilled) affect them alike. The order is a random permutation
	// of each round (a fixed seed): a rotation would keep every variant
	// behind the same neighbour, and the one behind the disk quota's
	// variants would pay for their background unmounts every time.
	variants := []func(i int) (time.Duration, error){
		func(int) (time.Duration, error) { return timePlain(shell, dir, env, false) },
		func(int) (time.Duration, error) { return timePlain(shell, dir, env, true) },
		func(i int) (time.Duration, error) { return timeTask(noCg, dir, i) },
		func(i int) (time.Duration, error) { return timeTask(withCg, dir, i) },
		func(i int) (time.Duration, error) { return timeTenant(tenant, dir, i, executor.NetworkNode) },
		func(i int) (time.Duration, error) { return timeTenant(tenant, dir, i, executor.NetworkNone) },
		func(i int) (time.Duration, error) { return timeTenantDisk(tenantDisk, dir, i, 0, executor.NetworkNode) },
		func(i int) (time.Duration, error) {
			return timeTenantDisk(tenantDisk, dir, i, 1<<30, executor.NetworkNode)
		},
	}
	// A task of a workspace (network None, its directory carried over)
	// against a plain tenant task of network None: the workspace's
	// namespace is joined, its tree attached at /home/task, the carry
	// record written and read.
	ws, err := tenant.OpenWorkspace(executor.WorkspaceOptions{ID: fmt.Sprintf("bench-%d", pid), UID: benchUID + 1, GID: benchUID + 1, Network: executor.NetworkNone})
	if err != nil {
		return nil, err
	}
	defer func() { _ = ws.Remove() }() // the benchmark's result stands without it
	variants = append(variants, func(i int) (time.Duration, error) { return timeWorkspace(tenant, dir, i, ws) })
	egressOK := tenant.Capabilities().Egress
	if egressOK {
		variants = append(variants, func(i int) (time.Duration, error) { return timeTenant(tenant, dir, i, executor.NetworkEgress) })
	}
	times := make([][]time.Duration, len(variants))
	order := rand.New(rand.NewPCG(1, 2))
	for i := range iters + 10 {
		for _, v := range order.Perm(len(variants)) {
			d, err := variants[v](i)
			if err != nil {
				return nil, err
			}
			if i >= 10 { // warm-up
				times[v] = append(times[v], d)
			}
		}
	}
	plain, plainSid, exNoCg, exCg := times[0], times[1], times[2], times[3]
	mPlain, mPlainSid, mNoCg, mCg := stats.MedianDuration(plain), stats.MedianDuration(plainSid), stats.MedianDuration(exNoCg), stats.MedianDuration(exCg)
	mTenant, mTenantNone := stats.MedianDuration(times[4]), stats.MedianDuration(times[5])
	mDisk, mDiskOwn := stats.MedianDuration(times[6]), stats.MedianDuration(times[7])
	// A workspace task's overhead is the median of its differences to the
	// tenant task of the same round: on a loaded machine the medians of
	// the variants drift by a millisecond or more between runs, and
	// pairing the tasks run next to each other cancels that drift.
	mWorkspace := stats.MedianDuration(times[8])
	wsOverNone, wsOverNode := medianDiff(times[8], times[5]), medianDiff(times[8], times[4])
	var mTenantEgress time.Duration
	if egressOK {
		mTenantEgress = stats.MedianDuration(times[9])
	}
	// Making a workspace until it takes tasks: a plain directory with a
	// network namespace, and a 10Gi file system (mkfs.ext4, a loop
	// device, the mount) with one.
	mCreate, err := timeCreate(tenant, 20)
	if err != nil {
		return nil, err
	}
	var mCreateDisk time.Duration
	if diskOK {
		if mCreateDisk, err = timeCreate(tenantDisk, 20); err != nil {
			return nil, err
		}
	}

	// CPU per task, after the interleaved rounds so that no other
	// variant's processes are reaped (and counted) meanwhile.
	cpuCg, err := taskCPU(iters, func(i int) error { _, err := timeTask(withCg, dir, iters+i); return err })
	if err != nil {
		return nil, err
	}
	cpuTenant, err := taskCPU(iters, func(i int) error {
		_, err := timeTenant(tenant, dir, iters+10+i, executor.NetworkNode)
		return err
	})
	if err != nil {
		return nil, err
	}
	// At the agent's defaults: network Egress where it is offered and a
	// file system of the default size, as a task of the shared cluster.
	defaultNet := executor.NetworkNode
	if tenantDisk.Capabilities().Egress {
		defaultNet = executor.NetworkEgress
	}
	cpuDefault, err := taskCPU(iters, func(i int) error {
		_, err := timeTenantDisk(tenantDisk, dir, iters+10+i, 0, defaultNet)
		return err
	})
	if err != nil {
		return nil, err
	}
	cpuWorkspace, err := taskCPU(iters, func(i int) error {
		_, err := timeWorkspace(tenant, dir, iters+10+i, ws)
		return err
	})
	if err != nil {
		return nil, err
	}

	var sf streamFigures
	if stream {
		if sf, err = measureStream(dir, shell, rounds); err != nil {
			return nil, err
		}
	}

	w := report.NewTable(os.Stdout, true)
	fmt.Fprintf(w, "measure\texecutor\tbaseline\tratio\ttarget\t\n")
	fmt.Fprintf(w, "start `true`, process group (median of %d)\t%v\t%v\t%.2f\t<= 1.30\t\n", iters, mNoCg, mPlain, ratio(mNoCg, mPlain))
	cgName := "cgroup"
	if withCg.Mechanism() != executor.MechanismCgroup {
		cgName = "cgroup UNAVAILABLE, process group"
	}
	fmt.Fprintf(w, "start `true`, %s (median of %d)\t%v\t%v\t%.2f\t<= 1.60\t\n", cgName, iters, mCg, mPlain, ratio(mCg, mPlain))
	// Not a target: the same plain fork/exec plus only the new session
	// the executor must create. Where the kernel's autogroup scheduling is
	// on (kernel.sched_autogroup_enabled=1, the process in the root cpu
	// cgroup) every session is its own scheduling group, and on a busy
	// machine that alone costs the shell its place in the queue.
	fmt.Fprintf(w, "(plain with a new session, for reference)\t%v\t%v\t%.2f\t\t\n", mPlainSid, mPlain, ratio(mPlainSid, mPlain))
	fmt.Fprintf(w, "start `true`, tenant, network Node (median of %d)\t%v\t%v\t+%v\t<= +3ms\t\n", iters, mTenant, mPlain, (mTenant - mPlain).Round(10*time.Microsecond))
	fmt.Fprintf(w, "start `true`, tenant, network None (median of %d)\t%v\t%v\t+%v\t\t\n", iters, mTenantNone, mPlain, (mTenantNone - mPlain).Round(10*time.Microsecond))
	diskName := "disk quota"
	if !diskOK {
		diskName = "disk quota UNAVAILABLE (no loop devices or mkfs.ext4)"
	}
	fmt.Fprintf(w, "start `true`, tenant, %s 10Gi, pooled (median of %d)\t%v\t%v\t+%v\t\t\n", diskName, iters, mDisk, mTenant, (mDisk - mTenant).Round(10*time.Microsecond))
	fmt.Fprintf(w, "start `true`, tenant, %s 1Gi, made at start (median of %d)\t%v\t%v\t+%v\t\t\n", diskName, iters, mDiskOwn, mTenant, (mDiskOwn - mTenant).Round(10*time.Microsecond))
	fmt.Fprintf(w, "start `true`, tenant, in a workspace (None, carried dir) against network None (median of %d paired differences)\t%v\t%v\t%s\t<= +1ms\t\n",
		iters, mWorkspace, mTenantNone, signed(wsOverNone))
	fmt.Fprintf(w, "start `true`, tenant, in a workspace (None, carried dir) against network Node, its shims' pool (median of %d paired differences)\t%v\t%v\t%s\t\t\n",
		iters, mWorkspace, mTenant, signed(wsOverNode))
	fmt.Fprintf(w, "make a workspace, plain directory, network None (median of 20)\t%v\t\t\t\t\n", mCreate)
	if diskOK {
		fmt.Fprintf(w, "make a workspace, 10Gi file system, network None (median of 20)\t%v\t\t\t\t\n", mCreateDisk)
	}
	if egressOK {
		fmt.Fprintf(w, "start `true`, tenant, network Egress (median of %d)\t%v\t%v\t+%v\t<= +3ms\t\n", iters, mTenantEgress, mPlain, (mTenantEgress - mPlain).Round(10*time.Microsecond))
	} else {
		fmt.Fprintf(w, "start `true`, tenant, network Egress UNAVAILABLE: %v\t\t\t\t\t\n", tenant.EgressError())
	}
	fmt.Fprintf(w, "CPU of a task `true`, its processes, tenant (Node) against %s (mean of %d), ms\t%.2f\t%.2f\t+%.2f\t\t\n",
		cgName, iters, cpuTenant.task, cpuCg.task, cpuTenant.task-cpuCg.task)
	fmt.Fprintf(w, "CPU of a task `true`, the executor's, tenant (Node) against %s (mean of %d), ms\t%.2f\t%.2f\t+%.2f\t\t\n",
		cgName, iters, cpuTenant.executor, cpuCg.executor, cpuTenant.executor-cpuCg.executor)
	fmt.Fprintf(w, "CPU of a task `true`, tenant at the agent's defaults (network %s, %s 10Gi), its processes + the executor's, against tenant (Node) (mean of %d), ms\t%.2f\t%.2f\t%+.2f\t\t\n",
		defaultNet, diskName, iters, cpuDefault.task+cpuDefault.executor, cpuTenant.task+cpuTenant.executor, cpuDefault.task+cpuDefault.executor-cpuTenant.task-cpuTenant.executor)
	fmt.Fprintf(w, "CPU of a task `true` in a workspace, its processes, against tenant (Node) (mean of %d), ms\t%.2f\t%.2f\t%+.2f\t\t\n",
		iters, cpuWorkspace.task, cpuTenant.task, cpuWorkspace.task-cpuTenant.task)
	fmt.Fprintf(w, "CPU of a task `true` in a workspace, the executor's, against tenant (Node) (mean of %d), ms\t%.2f\t%.2f\t%+.2f\t\t\n",
		iters, cpuWorkspace.executor, cpuTenant.executor, cpuWorkspace.executor-cpuTenant.executor)
	if stream {
		sf.print(w)
	}
	if err := w.Flush(); err != nil {
		return nil, err
	}
	fmt.Printf("tenant starts that took a shim started ahead of them (--shim-pool-size %d): network Node %d of %d, None %d of %d, Egress %d of %d, in a workspace %d of %d; shim %s\n",
		executor.DefaultShimPoolSize, pooledStarts[executor.NetworkNode], 2*iters+10, pooledStarts[executor.NetworkNone], iters+10,
		pooledStarts[executor.NetworkEgress], iters+10, pooledWorkspaceStarts, 2*iters+10, shimDesc(shimBin))
	if stream {
		sf.printNotes()
	}

	{
		figures := phase.Figures{
			"executor.overhead_ratio":                  round(ratio(mNoCg, mPlain)),
			"executor.overhead_ratio_cgroup":           round(ratio(mCg, mPlain)),
			"executor.session_ratio":                   round(ratio(mPlainSid, mPlain)),
			"executor.tenant_overhead_ms":              round(float64(mTenant-mPlain) / float64(time.Millisecond)),
			"executor.tenant_none_overhead_ms":         round(float64(mTenantNone-mPlain) / float64(time.Millisecond)),
			"executor.tenant_disk_quota_overhead_ms":   round(float64(mDisk-mTenant) / float64(time.Millisecond)),
			"executor.task_cpu_ms":                     round(cpuCg.task),
			"executor.tenant_task_cpu_ms":              round(cpuTenant.task),
			"executor.tenant_default_task_cpu_ms":      round(cpuDefault.task + cpuDefault.executor),
			"executor.workspace_task_overhead_ms":      round(float64(wsOverNone) / float64(time.Millisecond)),
			"executor.workspace_task_overhead_node_ms": round(float64(wsOverNode) / float64(time.Millisecond)),
			"executor.workspace_task_cpu_ms":           round(cpuWorkspace.task),
			"executor.workspace_create_ms":             round(float64(mCreate) / float64(time.Millisecond)),
		}
		if stream {
			sf.addJSON(figures)
		}
		if diskOK {
			figures["executor.workspace_create_disk_ms"] = round(float64(mCreateDisk) / float64(time.Millisecond))
		}
		if egressOK {
			figures["executor.tenant_egress_overhead_ms"] = round(float64(mTenantEgress-mPlain) / float64(time.Millisecond))
		}
		return figures, nil
	}
}

// timePlain runs `<shell> -c true` with os/exec and the task's
// environment, doing what a task's caller sees done: start it, wait for its
// exit and read its stdout and stderr to EOF. With setsid the child gets a
// new session, the only process attribute the executor adds that costs
// the kernel time.
func timePlain(shell, dir string, env []string, setsid bool) (time.Duration, error) {
	var stdout, stderr bytes.Buffer
	begin := time.Now()
	cmd := exec.Command(shell, "-c", "true")
	cmd.Dir, cmd.Env = dir, env
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if setsid {
		cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	}
	err := cmd.Run()
	return time.Since(begin), err
}

func timeTask(ex *executor.Executor, dir string, i int) (time.Duration, error) {
	spill := filepath.Join(dir, "spill-"+strconv.Itoa(i)+"-"+string(ex.Mechanism()))
	d, _, err := timeStart(ex, executor.Spec{Command: "true", WorkingDir: dir, SpillDir: spill}, "true through the executor")
	return d, err
}

// shimBinary returns the tenant level's shim for the -shim flag: the
// executor's default (this binary) for "self", bashtask-shim built from
// this tree into dir for "", else the path given.
func shimBinary(flagValue, dir string) (string, error) {
	switch flagValue {
	case "self":
		return executor.DefaultShimPath, nil
	case "":
		out, err := testshim.Build(dir)
		if err != nil {
			return "", fmt.Errorf("bashtask-shim (run from the repository, or give -shim): %w", err)
		}
		return out, nil
	}
	return flagValue, nil
}

// shimDesc says which shim the -shim flag's value starts.
func shimDesc(flagValue string) string {
	switch flagValue {
	case "":
		return "bashtask-shim built from this tree"
	case "self":
		return "this binary"
	}
	return flagValue
}

// cpuPerTask is the CPU time of one task in ms: its own processes, reaped
// by the executor (RUSAGE_CHILDREN), and this process (the executor).
type cpuPerTask struct{ task, executor float64 }

// taskCPU runs n tasks one after another through start and returns their
// mean CPU time. At the tenant level the pool's shims are reaped by the
// task that took them; the few still idle at the end (started ahead) are
// counted in the next measurement, not this one.
func taskCPU(n int, start func(i int) error) (cpuPerTask, error) {
	usage := func(who int) time.Duration {
		var ru syscall.Rusage
		_ = syscall.Getrusage(who, &ru)
		return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	c0, s0 := usage(syscall.RUSAGE_CHILDREN), usage(syscall.RUSAGE_SELF)
	for i := range n {
		if err := start(i); err != nil {
			return cpuPerTask{}, err
		}
	}
	c1, s1 := usage(syscall.RUSAGE_CHILDREN), usage(syscall.RUSAGE_SELF)
	per := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) / float64(n) }
	return cpuPerTask{task: per(c1 - c0), executor: per(s1 - s0)}, nil
}

// benchUID is the task UID of the tenant measurements (the agent's default
// range starts here).
const benchUID = 2000000

// pooledStarts counts, by network, the tenant starts that took a shim
// started ahead of them.
var pooledStarts = map[executor.Network]int{}

// timeTenant runs `true` at the tenant level in a fresh working directory
// owned by its UID, as the agent does.
func timeTenant(ex *executor.Executor, dir string, i int, network executor.Network) (time.Duration, error) {
	spill := filepath.Join(dir, "spill-"+strconv.Itoa(i)+"-tenant-"+string(network))
	d, task, err := timeStart(ex, executor.Spec{Command: "true", SpillDir: spill, Network: network, User: &executor.User{UID: benchUID, GID: benchUID}},
		"true at the tenant level")
	if err == nil && task.PooledShim() {
		pooledStarts[network]++
	}
	return d, err
}

// pooledWorkspaceStarts counts the workspace tasks that took a shim
// started ahead of them (of the pool of network Node).
var pooledWorkspaceStarts int

// timeWorkspace times `true` in workspace ws, its directory carried.
func timeWorkspace(ex *executor.Executor, dir string, i int, ws *executor.Workspace) (time.Duration, error) {
	spill := filepath.Join(dir, "spill-"+strconv.Itoa(i)+"-workspace")
	d, task, err := timeStart(ex, executor.Spec{Command: "true", SpillDir: spill, Workspace: &executor.WorkspaceTask{Workspace: ws, Carry: true}},
		"true in a workspace")
	if err == nil && task.PooledShim() {
		pooledWorkspaceStarts++
	}
	return d, err
}

// timeCreate makes and removes n workspaces of network None on ex (a
// file system of the default size where ex has a disk quota) and returns
// the median time OpenWorkspace took.
func timeCreate(ex *executor.Executor, n int) (time.Duration, error) {
	images, err := os.MkdirTemp("", "bench-ws-")
	if err != nil {
		return 0, err
	}
	defer os.RemoveAll(images)
	var times []time.Duration
	for i := range n {
		o := executor.WorkspaceOptions{ID: fmt.Sprintf("bench-create-%d-%d", os.Getpid(), i), UID: benchUID + 2, GID: benchUID + 2,
			Network: executor.NetworkNone, Image: filepath.Join(images, strconv.Itoa(i)+".img")}
		begin := time.Now()
		ws, err := ex.OpenWorkspace(o)
		if err != nil {
			return 0, err
		}
		times = append(times, time.Since(begin))
		if err := ws.Remove(); err != nil {
			return 0, err
		}
	}
	return stats.MedianDuration(times), nil
}

// timeTenantDisk times `true` at the tenant level with a working
// directory of size bytes (0: the executor's default) and network.
func timeTenantDisk(ex *executor.Executor, dir string, i int, size int64, network executor.Network) (time.Duration, error) {
	spill := filepath.Join(dir, "spill-"+strconv.Itoa(i)+"-disk-"+strconv.FormatInt(size, 10))
	d, _, err := timeStart(ex, executor.Spec{Command: "true", SpillDir: spill, Network: network, Limits: executor.Limits{DiskBytes: size}, User: &executor.User{UID: benchUID, GID: benchUID}},
		"true at the tenant level with a disk quota")
	return d, err
}

// timeStart runs spec to its end and returns the time from Start to Done
// and the task; a task that did not succeed is an error naming what, and
// the task's spill directory is removed.
func timeStart(ex *executor.Executor, spec executor.Spec, what string) (time.Duration, *executor.Task, error) {
	begin := time.Now()
	task, err := ex.Start(spec)
	if err != nil {
		return 0, nil, err
	}
	<-task.Done()
	took := time.Since(begin)
	res, _ := task.Result()
	if res.Reason != executor.ReasonSucceeded {
		return 0, nil, fmt.Errorf("%s: %s (%s)", what, res.Reason, res.Message)
	}
	return took, task, os.RemoveAll(spec.SpillDir)
}

// producer is the 2 GB command: dd of /dev/zero in writes of 1 MiB. GNU
// head -c writes 8 KiB at a time, one system call each, and on a 2-core
// machine it was the ceiling (about 1.0 to 1.5 GB/s into any reader,
// below SHA-256's one-core speed): the figure measured the producer, not
// the executor.
func producer() string {
	return fmt.Sprintf("dd if=/dev/zero bs=1M count=%d iflag=count_bytes status=none", streamBytes)
}

// plainWrite times [producer] into a file and returns MB/s.
func plainWrite(dir string) (float64, error) {
	file := filepath.Join(dir, "plain")
	defer os.Remove(file)
	begin := time.Now()
	out, err := exec.Command("/bin/sh", "-c", producer()+" > "+file).CombinedOutput()
	if err != nil {
		return 0, fmt.Errorf("plain write: %w: %s", err, out)
	}
	return float64(streamBytes) / 1e6 / time.Since(begin).Seconds(), nil
}

// pipeDrain runs the 2 GB command with its stdout on a pipe that this
// process reads into io.Discard: the fastest any reader of the same
// command's output can be on this machine, the baseline of the executor's
// throughput.
func pipeDrain(shell string) (float64, error) {
	cmd := exec.Command(shell, "-c", producer())
	out, err := cmd.StdoutPipe()
	if err != nil {
		return 0, err
	}
	begin := time.Now()
	if err := cmd.Start(); err != nil {
		return 0, err
	}
	n, err := io.CopyBuffer(io.Discard, out, make([]byte, 1<<20))
	if werr := cmd.Wait(); err == nil {
		err = werr
	}
	if err != nil {
		return 0, fmt.Errorf("pipe drain: %w", err)
	}
	if n != streamBytes {
		return 0, fmt.Errorf("pipe drain: %d bytes, want %d", n, streamBytes)
	}
	return float64(streamBytes) / 1e6 / time.Since(begin).Seconds(), nil
}

// sha256Rate returns the speed of SHA-256 on one core over 1 GiB in 1 MiB
// writes from memory, in MB/s: the most any reader that hashes every byte
// of a stream in order can move.
func sha256Rate() float64 {
	buf := make([]byte, 1<<20)
	h := sha256.New()
	begin := time.Now()
	for range 1024 {
		h.Write(buf)
	}
	h.Sum(nil)
	return float64(1<<30) / 1e6 / time.Since(begin).Seconds()
}

// vmHWM reads the peak resident set size in KiB from /proc/self/status.
func vmHWM() (int64, error) {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0, err
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			return strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
		}
	}
	return 0, errors.New("no VmHWM in /proc/self/status")
}

// signed is d rounded to 10µs with its sign.
func signed(d time.Duration) string {
	if d < 0 {
		return d.Round(10 * time.Microsecond).String()
	}
	return "+" + d.Round(10*time.Microsecond).String()
}

// medianDiff is the median of a[i]-b[i]: the differences of the pairs
// measured in the same round.
func medianDiff(a, b []time.Duration) time.Duration {
	d := make([]time.Duration, min(len(a), len(b)))
	for i := range d {
		d[i] = a[i] - b[i]
	}
	return stats.MedianDuration(d)
}

func ratio(a, b time.Duration) float64 { return float64(a) / float64(b) }

func round(f float64) float64 { return float64(int64(f*100+0.5)) / 100 }
