package system

import (
	"context"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/bashtask/bashtask-operator/hack/bench/phase"
	"github.com/bashtask/bashtask-operator/hack/bench/report"
	"github.com/bashtask/bashtask-operator/internal/procfs"
)

// component is one process of the local cluster.
type component struct {
	name string
	pid  int
	// pprofURL is the base of its /debug/pprof endpoints; empty when it has
	// none the benchmark can reach.
	pprofURL string
}

// components lists the processes of the cluster in dir: those the launcher
// supervises (pids/<name>), its etcd and kube-apiserver (controlPlane), and
// this benchmark itself.
func components(dir string, controlPlane []int) []component {
	var out []component
	entries, _ := os.ReadDir(filepath.Join(dir, "pids"))
	for _, e := range entries {
		pid := readPID(filepath.Join(dir, "pids", e.Name()))
		if pid == 0 {
			continue
		}
		c := component{name: e.Name(), pid: pid}
		if addr := flagValue(pid, "--pprof-bind-address", "--pprof-address"); addr != "" && addr != "0" {
			c.pprofURL = "http://" + addr + "/debug/pprof"
		}
		out = append(out, c)
	}
	out = append(out, named(controlPlane)...)
	out = append(out, component{name: "bench (client)", pid: os.Getpid()})
	slices.SortFunc(out, func(a, b component) int { return strings.Compare(a.name, b.name) })
	return out
}

// rawComponents lists the processes of the raw API phase: the etcd and
// kube-apiserver this benchmark started, but the shared cluster's
// (cluster), and itself.
func rawComponents(cluster []int) []component {
	var raw []int
	for _, pid := range phase.ControlPlaneChildren() {
		if !slices.Contains(cluster, pid) {
			raw = append(raw, pid)
		}
	}
	return append(named(raw), component{name: "bench (client)", pid: os.Getpid()})
}

// named names each of pids by its command (etcd, kube-apiserver).
func named(pids []int) []component {
	var out []component
	for _, pid := range pids {
		comm, _ := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "comm"))
		out = append(out, component{name: strings.TrimSpace(string(comm)), pid: pid})
	}
	return out
}

func readPID(path string) int {
	raw, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	pid, _ := strconv.Atoi(strings.TrimSpace(string(raw)))
	return pid
}

// flagValue returns the value of the first of names on the command line of
// pid, in either --name=value or --name value form.
func flagValue(pid int, names ...string) string {
	cmdline, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "cmdline"))
	if err != nil {
		return ""
	}
	args := strings.Split(string(cmdline), "\x00")
	for _, name := range names {
		for i, a := range args {
			if v, ok := strings.CutPrefix(a, name+"="); ok {
				return v
			} else if a == name && i+1 < len(args) {
				return args[i+1]
			}
		}
	}
	return ""
}

// cpuTimes returns the user plus system time of pid itself (children not
// included, so the shells an agent runs are not counted in the agent), and
// that of its children that ended and were waited for: for an agent, the
// tasks' shells.
func cpuTimes(pid int) (self, children time.Duration, ok bool) {
	st, err := procfs.ReadStat(pid)
	if err != nil {
		return 0, 0, false
	}
	tick := time.Second / procfs.ClockTicks
	return time.Duration(st.UTime+st.STime) * tick, time.Duration(st.CUTime+st.CSTime) * tick, true
}

// cpuSnapshot is the CPU time of each component at one moment.
type cpuSnapshot struct {
	at  time.Time
	cpu map[string]time.Duration
}

// snapshotCPU reads the CPU time of each component, and of the children of
// the agents (their tasks' processes) under "<agent> tasks".
func snapshotCPU(cs []component) cpuSnapshot {
	s := cpuSnapshot{at: time.Now(), cpu: map[string]time.Duration{}}
	for _, c := range cs {
		if self, children, ok := cpuTimes(c.pid); ok {
			s.cpu[c.name] = self
			if strings.HasPrefix(c.name, "agent-") {
				s.cpu[c.name+" tasks"] = children
			}
		}
	}
	return s
}

// cpuTotal adds up the CPU each component used over several windows, and
// the windows' wall time.
type cpuTotal struct {
	wall time.Duration
	cpu  map[string]time.Duration
}

// add counts the CPU used between two snapshots of the same components;
// a component missing from either is left out.
func (t *cpuTotal) add(before, after cpuSnapshot) {
	if t.cpu == nil {
		t.cpu = map[string]time.Duration{}
	}
	t.wall += after.at.Sub(before.at)
	for name, v := range after.cpu {
		if b, ok := before.cpu[name]; ok {
			t.cpu[name] += v - b
		}
	}
}

// msPerTask is the CPU of one component in milliseconds per task, NaN
// when it was not measured.
func (t cpuTotal) msPerTask(name string, tasks int) float64 {
	used, ok := t.cpu[name]
	if !ok || tasks == 0 {
		return math.NaN()
	}
	return float64(used.Microseconds()) / 1000 / float64(tasks)
}

// idleCores is the CPU of every component but the excluded one divided by
// the wall time, in cores.
func idleCores(t cpuTotal, exclude string) float64 {
	if t.wall <= 0 {
		return math.NaN()
	}
	var sum time.Duration
	for name, v := range t.cpu {
		if name != exclude {
			sum += v
		}
	}
	return sum.Seconds() / t.wall.Seconds()
}

// print prints, per component, the CPU it used in the windows: in cores
// (CPU seconds per second of the windows) and in milliseconds per task.
// The rest of the machine's CPU went to the kernel's own work and to
// whatever else ran on the machine.
func (t cpuTotal) print(phase string, tasks int) {
	if t.wall <= 0 || tasks == 0 {
		return
	}
	fmt.Printf("CPU per component in the %s (%.1f s, /proc/<pid>/stat, children not included):\n", phase, t.wall.Seconds())
	tw := report.NewTable(os.Stdout, false)
	fmt.Fprintf(tw, "  component\tcores\tms per task\n")
	var total time.Duration
	for _, name := range sortedKeys(t.cpu) {
		used := t.cpu[name]
		total += used
		fmt.Fprintf(tw, "  %s\t%.2f\t%.2f\n", name, used.Seconds()/t.wall.Seconds(), float64(used.Microseconds())/1000/float64(tasks))
	}
	fmt.Fprintf(tw, "  all of the above\t%.2f\t%.2f\n", total.Seconds()/t.wall.Seconds(), float64(total.Microseconds())/1000/float64(tasks))
	_ = tw.Flush()
}

// startProfiles starts CPU profiles of length d (profileComponents) and
// returns a function that waits until they are written.
func (b *bench) startProfiles(ctx context.Context, cs []component, dir string, d time.Duration) (wait func()) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		b.profileComponents(ctx, cs, dir, d)
	}()
	return func() { <-done }
}

// profileComponents takes a CPU profile of length d from the API server
// (through the client, which the administrator's credentials authorize) and
// from every component with a pprof endpoint, at once, into dir as
// <component>.pprof. Failures are printed, not returned: a profile is an
// aid, not a figure.
func (b *bench) profileComponents(ctx context.Context, cs []component, dir string, d time.Duration) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		fmt.Printf("profile: %v\n", err)
		return
	}
	secs := strconv.Itoa(int(d.Seconds()))
	var wg sync.WaitGroup
	save := func(name string, get func(context.Context) ([]byte, error)) {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(ctx, d+30*time.Second)
			defer cancel()
			raw, err := get(ctx)
			if err == nil {
				err = os.WriteFile(filepath.Join(dir, name+".pprof"), raw, 0o644)
			}
			if err != nil {
				fmt.Printf("profile of %s: %v\n", name, err)
			}
		})
	}
	save("kube-apiserver", func(ctx context.Context) ([]byte, error) {
		return b.cs.Discovery().RESTClient().Get().AbsPath("/debug/pprof/profile").Param("seconds", secs).DoRaw(ctx)
	})
	for _, c := range cs {
		if c.pprofURL != "" {
			save(c.name, func(ctx context.Context) ([]byte, error) {
				return httpGet(ctx, c.pprofURL+"/profile?seconds="+secs)
			})
		}
	}
	wg.Wait()
	fmt.Printf("CPU profiles of %s written to %s\n", d, dir)
}
