//go:build linux

package executor

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/nftables"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/net/dns/dnsmessage"

	"github.com/bashtask/bashtask-operator/internal/rig/upstream"
)

// requireEgressHost skips where the host cannot run NetworkEgress tests:
// not root, or no nf_tables in the kernel.
func requireEgressHost(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("network Egress needs root (CAP_NET_ADMIN for veth pairs and nftables)")
	}
	c, err := nftables.New()
	if err == nil {
		_, err = c.ListTables()
	}
	if err != nil {
		t.Skipf("network Egress needs nf_tables: %v", err)
	}
}

// serveLine answers every TCP connection on l with line and closes it.
func serveLine(t *testing.T, l net.Listener, line string) {
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			fmt.Fprintln(c, line)
			c.Close()
		}
	}()
}

// dialLine connects to addr and reads one line.
func dialLine(addr string) (string, error) {
	c, err := net.DialTimeout("tcp", addr, 3*time.Second)
	if err != nil {
		return "", err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(3 * time.Second))
	line, err := bufio.NewReader(c).ReadString('\n')
	return strings.TrimSpace(line), err
}

// serveDNS answers A queries for names under probe.test. with a, other
// queries with no answer.
func serveDNS(t *testing.T, pc net.PacketConn, a netip.Addr) {
	t.Cleanup(func() { pc.Close() })
	go func() {
		buf := make([]byte, 512)
		for {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			var p dnsmessage.Parser
			h, err := p.Start(buf[:n])
			if err != nil {
				continue
			}
			q, err := p.Question()
			if err != nil {
				continue
			}
			b := dnsmessage.NewBuilder(nil, dnsmessage.Header{ID: h.ID, Response: true, Authoritative: true, RecursionDesired: h.RecursionDesired})
			_ = b.StartQuestions()
			_ = b.Question(q)
			_ = b.StartAnswers()
			if q.Type == dnsmessage.TypeA && strings.HasSuffix(q.Name.String(), "probe.test.") {
				_ = b.AResource(dnsmessage.ResourceHeader{Name: q.Name, Type: dnsmessage.TypeA, Class: dnsmessage.ClassINET, TTL: 60}, dnsmessage.AResource{A: a.As4()})
			}
			if msg, err := b.Finish(); err == nil {
				_, _ = pc.WriteTo(msg, from)
			}
		}
	}()
}

// testInternet is a stand-in for the internet: a network namespace of the
// test's own with a veth pair to the host and addresses from the benchmark
// range 198.18.0.0/15, so no packet leaves the machine.
type testInternet struct {
	ns       netns.NsHandle
	addr     netip.Addr // its address on the pair, serving TCP 8080
	hostSide netip.Addr // the host's address on the pair
	denied   netip.Addr // a second address of it, in a denied range; the resolver (UDP 53)
	metadata netip.Addr // 169.254.169.254 on it too, so only a rule blocks it
}

// internetPort is the port the test internet serves a line on.
const internetPort = 8080

// newTestInternet sets up the test internet and removes it at cleanup.
// It holds a host-wide lock while its test runs: the host route to
// 169.254.169.254 exists once per host.
func newTestInternet(t *testing.T) *testInternet {
	t.Helper()
	lock, err := os.OpenFile(os.TempDir()+"/bashtask-egress-test.lock", os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lock.Close() })

	pid := os.Getpid()
	name := fmt.Sprintf("bt-test-%d", pid)
	base := netip.MustParseAddr("198.18.0.0").As4()
	at := func(slot, off int) netip.Addr {
		v := uint32(base[0])<<24 | uint32(base[1])<<16 | uint32(slot%32768)<<2 | uint32(off)
		return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
	}
	ti := &testInternet{hostSide: at(pid, 1), addr: at(pid, 2), denied: at(pid+16384, 1), metadata: netip.MustParseAddr("169.254.169.254")}
	ns, err := upstream.NewNamedNetns(name)
	if err != nil {
		t.Fatalf("creating network namespace %s: %v", name, err)
	}
	ti.ns = ns
	t.Cleanup(func() {
		ti.ns.Close()
		_ = netns.DeleteNamed(name)
	})
	hostLink := fmt.Sprintf("vbt%d", pid)
	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: hostLink}, PeerName: "eth0", PeerNamespace: netlink.NsFd(int(ti.ns))}
	if err := netlink.LinkAdd(veth); err != nil {
		t.Fatalf("veth %s: %v", hostLink, err)
	}
	t.Cleanup(func() { _ = netlink.LinkDel(veth) })
	mustAddr := func(h *netlink.Handle, l netlink.Link, a netip.Addr, bits int) {
		t.Helper()
		if err := h.AddrAdd(l, &netlink.Addr{IPNet: &net.IPNet{IP: a.AsSlice(), Mask: net.CIDRMask(bits, 32)}}); err != nil {
			t.Fatalf("address %s on %s: %v", a, l.Attrs().Name, err)
		}
	}
	host, err := netlink.NewHandle()
	if err != nil {
		t.Fatal(err)
	}
	defer host.Close()
	mustAddr(host, veth, ti.hostSide, 30)
	if err := host.LinkSetUp(veth); err != nil {
		t.Fatal(err)
	}
	h, err := netlink.NewHandleAt(ti.ns)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	peer, err := h.LinkByName("eth0")
	if err != nil {
		t.Fatal(err)
	}
	lo, err := h.LinkByName("lo")
	if err != nil {
		t.Fatal(err)
	}
	mustAddr(h, peer, ti.addr, 30)
	mustAddr(h, lo, ti.denied, 32)
	mustAddr(h, lo, ti.metadata, 32)
	for _, l := range []netlink.Link{peer, lo} {
		if err := h.LinkSetUp(l); err != nil {
			t.Fatal(err)
		}
	}
	for _, dst := range []netip.Addr{ti.denied, ti.metadata} {
		r := &netlink.Route{LinkIndex: veth.Attrs().Index, Dst: &net.IPNet{IP: dst.AsSlice(), Mask: net.CIDRMask(32, 32)}, Gw: ti.addr.AsSlice()}
		if err := host.RouteAdd(r); err != nil {
			t.Fatalf("host route to %s: %v", dst, err)
		}
		t.Cleanup(func() { _ = netlink.RouteDel(r) })
	}
	if err := upstream.InNetns(ti.ns, func() error {
		l, err := net.Listen("tcp4", fmt.Sprintf(":%d", internetPort))
		if err != nil {
			return err
		}
		serveLine(t, l, "internet")
		// On the resolver's address: a socket on the wildcard address
		// would answer from the address of the route back instead.
		pc, err := net.ListenPacket("udp4", netip.AddrPortFrom(ti.denied, 53).String())
		if err != nil {
			return err
		}
		serveDNS(t, pc, ti.addr)
		return nil
	}); err != nil {
		t.Fatalf("serving in %s: %v", name, err)
	}
	return ti
}

// egressTestConfig is an EgressConfig whose ID, task range and denied
// range are this process's own.
func egressTestConfig(ti *testInternet) *EgressConfig {
	pid := os.Getpid()
	// 100.64.0.0/11: the agent package's tests take 100.96.0.0/11.
	cidr := netip.PrefixFrom(netip.AddrFrom4([4]byte{100, byte(64 + (pid>>8)%32), byte(pid), 0}), 24)
	return &EgressConfig{
		ID:        fmt.Sprintf("t%x", pid%(1<<24)),
		CIDR:      cidr.String(),
		Deny:      []string{netip.PrefixFrom(ti.denied, 32).String()},
		Resolvers: []string{ti.denied.String()},
		Search:    []string{"test"},
	}
}

// probes is a shell function that tries a TCP connection per target in
// parallel and prints "<name> reached <line>" or "<name> blocked".
const probes = `probe() { if out=$(timeout 3 bash -c "exec 3<>/dev/tcp/$2/$3 && head -n1 <&3" 2>/dev/null) && [ -n "$out" ]; then echo "$1 reached $out"; else echo "$1 blocked"; fi; }
`

// runProbes runs the probes of targets (name -> host:port) in a task of
// network on ex and returns each probe's outcome, and the rest of the
// output by line.
func runProbes(t *testing.T, ex *Executor, network Network, targets map[string]string, extra string) (map[string]string, []string) {
	t.Helper()
	spec := testSpec(t, "")
	spec.Network = network
	return runProbesAs(t, ex, spec, targets, extra)
}

// runProbesAs is runProbes with spec (its command replaced by the
// probes'), e.g. a workspace task's.
func runProbesAs(t *testing.T, ex *Executor, spec Spec, targets map[string]string, extra string) (map[string]string, []string) {
	t.Helper()
	network := spec.Network
	if spec.Workspace != nil {
		network = spec.Workspace.Workspace.Network()
	}
	var cmd strings.Builder
	cmd.WriteString(probes)
	for _, name := range slices.Sorted(func(yield func(string) bool) {
		for k := range targets {
			if !yield(k) {
				return
			}
		}
	}) {
		host, port, _ := strings.Cut(targets[name], ":")
		fmt.Fprintf(&cmd, "probe %s %s %s &\n", name, host, port)
	}
	cmd.WriteString("wait\n" + extra)
	spec.Command = cmd.String()
	res := run(t, ex, spec)
	if res.Reason != ReasonSucceeded {
		t.Fatalf("probe task: %s %s\nstdout: %s\nstderr: %s", res.Reason, res.Message, res.Stdout.Tail, res.Stderr.Tail)
	}
	got := map[string]string{}
	var rest []string
	for _, line := range strings.Split(strings.TrimSpace(res.Stdout.Tail), "\n") {
		name, outcome, _ := strings.Cut(line, " ")
		if _, ok := targets[name]; ok {
			got[name] = outcome
		} else {
			rest = append(rest, line)
		}
	}
	if network == NetworkEgress && (res.Isolation.Network != NetworkEgress || !slices.Contains(res.Isolation.Namespaces, "net")) {
		t.Errorf("isolation %+v, want network egress with a net namespace", res.Isolation)
	}
	return got, rest
}

// A task of network Egress reaches the test internet and its DNS, and
// nothing of the host, the denied ranges, the metadata address or another
// task; a task of network Node, the positive control, reaches the host's
// loopback.
func TestEgressReachesOnlyTheOutside(t *testing.T) {
	requireEgressHost(t)
	ti := newTestInternet(t)
	cfg := egressTestConfig(ti)
	ex := newTestExecutor(t, CgroupAuto, func(c *Config) { c.Isolation = IsolationTenant; c.Egress = cfg })
	if !ex.Capabilities().Egress {
		t.Fatalf("no egress capability: %v", ex.EgressError())
	}

	hostLo, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	serveLine(t, hostLo, "host")
	hostAddr, err := net.Listen("tcp4", netip.AddrPortFrom(ti.hostSide, 0).String())
	if err != nil {
		t.Fatal(err)
	}
	serveLine(t, hostAddr, "host")

	// Another Egress task, with a listener in its network namespace.
	other := testSpec(t, "sleep 120")
	other.Network = NetworkEgress
	otherTask, err := ex.Start(other)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { otherTask.Cancel(); _, _ = otherTask.Wait(context.Background()) })
	otherNS, err := netns.GetFromPid(otherTask.PID())
	if err != nil {
		t.Fatal(err)
	}
	defer otherNS.Close()
	otherAddr := netip.AddrPortFrom(otherTask.sys.net.task, 9090).String()
	if err := upstream.InNetns(otherNS, func() error {
		l, err := net.Listen("tcp4", otherAddr)
		if err != nil {
			return err
		}
		serveLine(t, l, "othertask")
		return nil
	}); err != nil {
		t.Fatalf("listening in the other task's namespace: %v", err)
	}

	// Positive controls: every target answers where no rule is in the way.
	internet := netip.AddrPortFrom(ti.addr, internetPort).String()
	targets := map[string]string{
		"internet": internet,
		"hostlo":   hostLo.Addr().String(),
		"hostaddr": hostAddr.Addr().String(),
		"denied":   netip.AddrPortFrom(ti.denied, internetPort).String(),
		"metadata": netip.AddrPortFrom(ti.metadata, internetPort).String(),
		"task":     otherAddr,
	}
	for name, addr := range targets {
		dial := func() error {
			line, err := dialLine(addr)
			if err == nil && line == "" {
				err = errors.New("empty answer")
			}
			return err
		}
		if name == "task" {
			err = upstream.InNetns(otherNS, dial)
		} else {
			err = dial()
		}
		if err != nil {
			t.Fatalf("positive control: %s (%s) does not answer the host: %v", name, addr, err)
		}
	}

	got, rest := runProbes(t, ex, NetworkEgress, targets, "echo dns $(getent hosts probe.test | cut -d' ' -f1)\ngrep -c '^nameserver "+ti.denied.String()+"$' /etc/resolv.conf | sed 's/^/resolvconf /'\n")
	want := map[string]string{
		"internet": "reached internet",
		"hostlo":   "blocked",
		"hostaddr": "blocked",
		"denied":   "blocked",
		"metadata": "blocked",
		"task":     "blocked",
	}
	for name, w := range want {
		if got[name] != w {
			t.Errorf("egress task to %s (%s): %q, want %q", name, targets[name], got[name], w)
		}
	}
	wantRest := []string{"dns " + ti.addr.String(), "resolvconf 1"}
	if !slices.Equal(rest, wantRest) {
		t.Errorf("DNS through the resolver %s: %q, want %q", ti.denied, rest, wantRest)
	}

	node, _ := runProbes(t, ex, NetworkNode, map[string]string{"hostlo": hostLo.Addr().String()}, "")
	if node["hostlo"] != "reached host" {
		t.Errorf("positive control: a Node task to the host's loopback: %q, want reached host", node["hostlo"])
	}
}

// The table and the task links live as long as the executor: Close removes
// them, and a new executor with the same ID removes what a crashed one
// left.
func TestEgressCleanupAndRecovery(t *testing.T) {
	requireEgressHost(t)
	ti := newTestInternet(t)
	cfg := egressTestConfig(ti)
	plan, err := planEgress(*cfg)
	if err != nil {
		t.Fatal(err)
	}
	tableExists := func() bool {
		c, err := nftables.New()
		if err != nil {
			t.Fatal(err)
		}
		_, err = c.ListTableOfFamily(plan.table, nftables.TableFamilyINet)
		return err == nil
	}
	links := func() []string {
		ls, err := linkList()
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, l := range ls {
			if strings.HasPrefix(l.Attrs().Name, plan.prefix) {
				out = append(out, l.Attrs().Name)
			}
		}
		return out
	}
	// A link an earlier run left: a veth pair of the prefix's name.
	stale := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: plan.linkName(7)}, PeerName: fmt.Sprintf("vbs%d", os.Getpid())}
	if err := netlink.LinkAdd(stale); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = netlink.LinkDel(stale) })

	ex := newTestExecutor(t, CgroupAuto, func(c *Config) { c.Isolation = IsolationTenant; c.Egress = cfg; c.ShimPoolSize = 1 })
	if !ex.Capabilities().Egress {
		t.Fatalf("no egress capability: %v", ex.EgressError())
	}
	if slices.Contains(links(), plan.linkName(7)) {
		t.Errorf("the stale link %s was not removed", plan.linkName(7))
	}
	if !tableExists() {
		t.Fatalf("no nftables table %s", plan.table)
	}
	spec := testSpec(t, "exit 0")
	spec.Network = NetworkEgress
	if res := run(t, ex, spec); res.Reason != ReasonSucceeded {
		t.Fatalf("egress task: %s %s", res.Reason, res.Message)
	}
	if err := ex.Close(); err != nil {
		t.Fatal(err)
	}
	if tableExists() {
		t.Errorf("table %s is still there after Close", plan.table)
	}
	if l := links(); len(l) > 0 {
		t.Errorf("links %v are still there after Close", l)
	}
}

// Egress where it was not set up is refused naming the reason, never
// replaced by another network.
func TestEgressRefusedWithoutSetup(t *testing.T) {
	ex := newTestExecutor(t, CgroupOff, func(c *Config) { c.Isolation = IsolationTenant; c.ShimPoolSize = -1 })
	if ex.Capabilities().Egress {
		t.Fatal("egress capability without Config.Egress")
	}
	spec := testSpec(t, "exit 0")
	spec.Network = NetworkEgress
	_, err := ex.Start(spec)
	if !errors.Is(err, ErrIsolation) || !strings.Contains(err.Error(), "network egress is not available: this executor was not configured for it") {
		t.Errorf("Start: %v, want ErrIsolation saying egress is not available", err)
	}
	process := newTestExecutor(t, CgroupOff, func(c *Config) { c.Isolation = IsolationProcess })
	if _, err := process.Start(spec); !errors.Is(err, ErrInvalidSpec) || !strings.Contains(err.Error(), "network egress needs the tenant isolation level") {
		t.Errorf("Start at the process level: %v, want ErrInvalidSpec", err)
	}
}

// Where Egress cannot be set up, New still succeeds without the egress
// capability, EgressError says why, and a task asking for Egress is refused
// naming that reason: here the probe's veth pair cannot be created, since
// a link of another kind holds the first slot's name.
func TestEgressRefusedWhenSetupFails(t *testing.T) {
	requireEgressHost(t)
	ti := newTestInternet(t)
	cfg := egressTestConfig(ti)
	plan, err := planEgress(*cfg)
	if err != nil {
		t.Fatal(err)
	}
	squatter := &netlink.Ifb{LinkAttrs: netlink.LinkAttrs{Name: plan.linkName(0)}}
	if err := netlink.LinkAdd(squatter); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = netlink.LinkDel(squatter) })
	ex := newTestExecutor(t, CgroupAuto, func(c *Config) { c.Isolation = IsolationTenant; c.Egress = cfg; c.ShimPoolSize = -1 })
	if ex.Capabilities().Egress || !errors.Is(ex.EgressError(), ErrIsolation) {
		t.Fatalf("capabilities %v, EgressError %v: want no egress and an ErrIsolation", ex.Capabilities().Names(), ex.EgressError())
	}
	spec := testSpec(t, "echo ran")
	spec.Network = NetworkEgress
	_, err = ex.Start(spec)
	t.Logf("the refusal: %v", err)
	want := "cannot isolate task: network egress is not available: egress: probe task:"
	if !errors.Is(err, ErrIsolation) || !strings.HasPrefix(err.Error(), want) || !strings.Contains(err.Error(), plan.linkName(0)) {
		t.Errorf("Start: %v, want an ErrIsolation starting %q and naming the link", err, want)
	}
	spec.Network = NetworkNone
	if res := run(t, ex, spec); res.Reason != ReasonSucceeded {
		t.Errorf("a None task beside it: %s %s", res.Reason, res.Message)
	}
}

// The host end of a task's veth pair has no IPv6 address, not even a
// link-local one, once it is up: nothing of the host a task could reach
// over IPv6.
func TestEgressHostEndHasNoIPv6Address(t *testing.T) {
	requireEgressHost(t)
	ti := newTestInternet(t)
	cfg := egressTestConfig(ti)
	plan, err := planEgress(*cfg)
	if err != nil {
		t.Fatal(err)
	}
	ex := newTestExecutor(t, CgroupAuto, func(c *Config) { c.Isolation = IsolationTenant; c.Egress = cfg; c.ShimPoolSize = 1 })
	if !ex.Capabilities().Egress {
		t.Fatalf("no egress capability: %v", ex.EgressError())
	}
	spec := testSpec(t, "sleep 1")
	spec.Network = NetworkEgress
	task, err := ex.Start(spec)
	if err != nil {
		t.Fatal(err)
	}
	defer wait(t, task)
	// The pool's shim of network Egress and the task's: links up a
	// moment, long enough for a link-local address to appear.
	time.Sleep(300 * time.Millisecond)
	ls, err := linkList()
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, l := range ls {
		if !strings.HasPrefix(l.Attrs().Name, plan.prefix) || l.Attrs().OperState != netlink.OperUp {
			continue
		}
		n++
		addrs, err := netlink.AddrList(l, netlink.FAMILY_V6)
		if err != nil {
			t.Fatal(err)
		}
		if len(addrs) > 0 {
			t.Errorf("host end %s has IPv6 addresses %v, want none", l.Attrs().Name, addrs)
		}
	}
	if n == 0 {
		t.Fatal("no host end of a task link up")
	}
}
