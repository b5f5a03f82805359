// Package egress is the egress phase of hack/bench: the cost of a
// workspace's egress policy by domain name (docs/egress.md) on a
// connection's setup. Two workspaces of network Egress on one tenant
// executor, one without a policy and one whose policy allows only the
// name of the server, connect to a server in a network namespace of the
// phase's own (an address of the benchmark range 198.18.0.0/15, so no
// packet leaves the machine) in alternating rounds; each task first
// resolves the name, then times its connections with bash's /dev/tcp
// and $EPOCHREALTIME. The table gives the p50 of both and the
// difference, against the target of at most +1 ms. Then a 1 GiB HTTPS
// download with curl from the same server (port 443), directly from the
// workspace without a policy and through the intercepting proxy of an
// injection rule in the other: MB/s of both and the ratio, against the
// target of at least 0.5.
package egress

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"maps"
	"net"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/bashtask/bashtask-operator/executor"
	"github.com/bashtask/bashtask-operator/hack/bench/phase"
	"github.com/bashtask/bashtask-operator/hack/bench/stats"
	"github.com/bashtask/bashtask-operator/internal/rig/testshim"
	"github.com/bashtask/bashtask-operator/internal/rig/upstream"
)

// Phase is the egress phase.
type Phase struct {
	n, rounds      int
	shimBin        string
	downloadBytes  int64
	downloadRounds int
}

// Name is "egress".
func (*Phase) Name() string { return "egress" }

// Flags registers the phase's flags.
func (p *Phase) Flags(fs *flag.FlagSet) {
	fs.IntVar(&p.n, "n", 200, "connections per task")
	fs.IntVar(&p.rounds, "rounds", 5, "tasks per workspace, alternating between the two")
	fs.Int64Var(&p.downloadBytes, "download-bytes", 1<<30, "bytes of the HTTPS download, direct and through the intercepting proxy; 0 skips it")
	fs.IntVar(&p.downloadRounds, "download-rounds", 2, "downloads per workspace, alternating")
	fs.StringVar(&p.shimBin, "shim", "", "the tenant level's shim binary: empty builds ./cmd/bashtask-shim from this tree; self is this binary")
}

// serverName is the name the phase's resolver answers with the server's
// address.
const serverName = "bench.egress.test"

// serverPort is the port the server accepts connections on.
const serverPort = 8080

// Run measures and prints the phase's table. It needs root.
func (p *Phase) Run(ctx context.Context, _ *phase.Env) (phase.Figures, error) {
	if os.Geteuid() != 0 {
		return nil, errors.New("egress: needs root (network namespaces, veth pairs, nftables)")
	}
	dir, err := os.MkdirTemp("", "bench-egress-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	if err := os.Chmod(dir, 0o755); err != nil { // tasks' UIDs traverse it
		return nil, err
	}
	srv, err := newServer()
	if err != nil {
		return nil, err
	}
	defer srv.close()
	ex, err := p.executor(dir, srv.Addr)
	if err != nil {
		return nil, err
	}
	defer ex.Close()
	plain, policed, err := workspaces(ex)
	if err != nil {
		return nil, err
	}
	defer func() { _ = plain.Remove(); _ = policed.Remove() }()
	var a, b []time.Duration
	for i := range p.rounds {
		for _, v := range []struct {
			w   *executor.Workspace
			out *[]time.Duration
		}{{plain, &a}, {policed, &b}} {
			ds, err := connectTimes(ctx, ex, v.w, srv.Addr, p.n, fmt.Sprintf("%s/spill-%d-%s", dir, i, v.w.ID()))
			if err != nil {
				return nil, err
			}
			*v.out = append(*v.out, ds...)
		}
	}
	figs := report(a, b)
	if p.downloadBytes > 0 {
		dl, err := p.downloads(ctx, ex, plain, policed, srv, dir)
		if err != nil {
			return nil, err
		}
		maps.Copy(figs, dl)
	}
	return figs, nil
}

// executor is a tenant executor with network Egress of an ID and a task
// range of this process's own, whose resolver is the phase's.
func (p *Phase) executor(dir string, resolver netip.Addr) (*executor.Executor, error) {
	shimPath := p.shimBin
	switch shimPath {
	case "self":
		shimPath = executor.DefaultShimPath
	case "":
		out, err := testshim.Build(dir)
		if err != nil {
			return nil, fmt.Errorf("bashtask-shim (run from the repository, or give -shim): %w", err)
		}
		shimPath = out
	}
	pid := os.Getpid()
	egress := &executor.EgressConfig{ID: fmt.Sprintf("g%x", pid%(1<<24)),
		CIDR: fmt.Sprintf("100.%d.%d.0/24", 64+((pid>>8)+7)%64, pid%256), Resolvers: []string{resolver.String()}}
	ex, err := executor.New(executor.Config{Cgroups: executor.CgroupAuto, CgroupParent: fmt.Sprintf("bashtask-bench-egress-%d", pid),
		WorkDirRoot: dir, Isolation: executor.IsolationTenant, ShimPath: shimPath, Egress: egress})
	if err != nil {
		return nil, err
	}
	if !ex.Capabilities().Egress {
		ex.Close()
		return nil, fmt.Errorf("egress: network Egress is not available: %w", ex.EgressError())
	}
	return ex, nil
}

// workspaces opens the two workspaces: without a policy, and with one
// that allows only serverName.
func workspaces(ex *executor.Executor) (plain, policed *executor.Workspace, err error) {
	base := uint32(2_102_000 + os.Getpid()%1000*2)
	if plain, err = ex.OpenWorkspace(executor.WorkspaceOptions{ID: "bench-egress-plain", UID: base, GID: base, Network: executor.NetworkEgress}); err != nil {
		return nil, nil, err
	}
	if policed, err = ex.OpenWorkspace(executor.WorkspaceOptions{ID: "bench-egress-policy", UID: base + 1, GID: base + 1, Network: executor.NetworkEgress}); err != nil {
		_ = plain.Remove()
		return nil, nil, err
	}
	pol := &executor.EgressPolicy{DefaultDeny: true, Allow: []executor.EgressRule{{Domain: serverName, Ports: []uint16{serverPort}}}}
	if err := policed.SetEgressPolicy(pol, nil); err != nil {
		_ = plain.Remove()
		_ = policed.Remove()
		return nil, nil, err
	}
	return plain, policed, nil
}

// connectTimes runs a task of w that resolves serverName and then
// connects n times to the server, and returns the connections' setup
// times.
func connectTimes(ctx context.Context, ex *executor.Executor, w *executor.Workspace, addr netip.Addr, n int, spill string) ([]time.Duration, error) {
	cmd := fmt.Sprintf(`getent ahostsv4 %s >/dev/null || { echo "cannot resolve %s" >&2; exit 1; }
for ((i = 0; i < %d; i++)); do
  t0=$EPOCHREALTIME; exec 3<>/dev/tcp/%s/%d || exit 1; t1=$EPOCHREALTIME; exec 3<&-
  echo $(( ${t1/./} - ${t0/./} ))
done`, serverName, serverName, n, addr, serverPort)
	t, err := ex.Start(executor.Spec{Command: cmd, SpillDir: spill, TailBytes: 64 << 10, Timeout: time.Minute,
		Workspace: &executor.WorkspaceTask{Workspace: w}})
	if err != nil {
		return nil, err
	}
	res, err := t.Wait(ctx)
	if err != nil {
		return nil, err
	}
	if res.Reason != executor.ReasonSucceeded {
		return nil, fmt.Errorf("egress: the connecting task of %s: %s %s: %s", w.ID(), res.Reason, res.Message, res.Stderr.Tail)
	}
	var out []time.Duration
	for _, line := range strings.Fields(res.Stdout.Tail) {
		us, err := strconv.ParseInt(line, 10, 64)
		if err != nil {
			return nil, fmt.Errorf("egress: the task's output %q: %w", line, err)
		}
		out = append(out, time.Duration(us)*time.Microsecond)
	}
	if len(out) != n {
		return nil, fmt.Errorf("egress: %d of %d connections timed", len(out), n)
	}
	return out, nil
}

// report prints the table and returns the figures.
func report(plain, policed []time.Duration) phase.Figures {
	p50a, p50b := stats.MedianDuration(plain), stats.MedianDuration(policed)
	p99a, p99b := stats.PercentileDuration(plain, 99), stats.PercentileDuration(policed, 99)
	w := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', tabwriter.Debug)
	fmt.Fprintln(w, "egress: TCP connection setup from a workspace task (bash /dev/tcp)\tp50\tp99\ttarget\t")
	fmt.Fprintf(w, "network Egress, no policy (%d connections)\t%v\t%v\t\t\n", len(plain), p50a, p99a)
	fmt.Fprintf(w, "network Egress, policy allowing the name on its port (%d connections)\t%v\t%v\t\t\n", len(policed), p50b, p99b)
	fmt.Fprintf(w, "difference\t%s\t%s\t<= +1ms p50\t\n", signed(p50b-p50a), signed(p99b-p99a))
	_ = w.Flush()
	ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
	return phase.Figures{
		"egress.connect_p50_ms_plain":   ms(p50a),
		"egress.connect_p50_ms_policy":  ms(p50b),
		"egress.policy_overhead_p50_ms": ms(p50b - p50a),
	}
}

// signed is d with its sign, +0s for zero.
func signed(d time.Duration) string {
	if d < 0 {
		return d.String()
	}
	return "+" + d.String()
}

// server is the phase's stand-in for the internet: an upstream
// (internal/rig/upstream) whose resolver answers serverName, with a TCP
// server on serverPort that accepts and closes.
type server struct {
	*upstream.Upstream
	listener net.Listener
}

// newServer sets the server up; close takes it down.
func newServer() (*server, error) {
	pid := os.Getpid()
	u, err := upstream.Start(upstream.Config{Name: fmt.Sprintf("bt-bench-egress-%d", pid), Link: fmt.Sprintf("vbe%d", pid%1000000),
		Slot: (pid + 8192) % upstream.Slots, Domains: []string{serverName}})
	if err != nil {
		return nil, fmt.Errorf("egress: %w", err)
	}
	s := &server{Upstream: u}
	if s.listener, err = u.Listen(serverPort); err != nil {
		u.Close()
		return nil, fmt.Errorf("egress: listening on port %d: %w", serverPort, err)
	}
	go func() {
		for {
			c, err := s.listener.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	return s, nil
}

func (s *server) close() {
	s.listener.Close()
	s.Close()
}
