//go:build linux

package executor

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// egress is the host side of NetworkEgress: the agent's nftables table,
// the task address slots and the tasks' resolv.conf.
//
// Mechanism: a veth pair per task, one end in the task's network namespace
// (EgressTaskLink, the task's /30 address, a default route to the other
// end), the other in the agent's network namespace; IPv4 forwarding and an
// nftables masquerade send the task's traffic out behind the agent's
// address. A veth pair and routing keep a task's packets in the kernel's
// ordinary path, where one table of rules decides what they reach (a
// user-space proxy such as slirp4netns or pasta would cost a process per
// task and a copy per packet, and macvlan/ipvlan would put tasks on the
// node's segment, beside its neighbours). Where the agent runs in a pod's
// network namespace (the chart's DaemonSet has no hostNetwork), the pairs
// and the table live there and NAT goes out through the pod's interface:
// the node's own network namespace is never touched.
//
// The table (family inet, named EgressTablePrefix + ID) has three base
// chains, each matching only this agent's links by the wildcard name
// prefix* so that another agent's table on the same host is independent:
//
//   - input: a packet from a task link to any address of the agent's
//     namespace (loopback included) is dropped, but DNS to a resolver;
//   - forward: from a task link to another task link, IPv6, and any
//     destination in the denied ranges (BuiltinEgressDeny, the task range,
//     EgressConfig.Deny) is dropped, but DNS to a resolver; to a task link
//     only replies (conntrack established or related) pass;
//   - postrouting (nat): the task range is masqueraded;
//   - prerouting (nat): jumps to policynat, where a workspace's
//     injection rules redirect HTTPS to its intercepting proxy;
//   - policy and policydns, regular chains the forward chain (after the
//     IPv6 rule) and the input chain (before its drop) jump to, where a
//     workspace's egress policy adds its rules (egressGuard).
//
// A drop in any base chain of any table is final in netfilter, so rules of
// other tables (kube-proxy, a CNI) cannot let through what these drop.
type egress struct {
	plan       *egressPlan
	resolvPath string // the tasks' resolv.conf, bound over /etc/resolv.conf
	resolvDir  string // its directory, removed by close

	mu   sync.Mutex
	used []bool // per slot
	next int    // where the search for a free slot starts: slots are reused last

	releasing sync.WaitGroup // deletions of pairs under way

	// rt is one route netlink socket in the agent's namespace for the
	// host ends' requests: a new socket per request (the netlink
	// package's functions) was a fifth of the link set-up's CPU. Its
	// requests take turns, as the kernel's routing lock has them do.
	rt *netlink.Handle
}

// handle is e.rt, or without it (an egress of a test) the netlink
// package's default of a socket per request.
func (e *egress) handle() *netlink.Handle {
	if e.rt == nil {
		return &netlink.Handle{}
	}
	return e.rt
}

// egressLink is one task's veth pair.
type egressLink struct {
	e          *egress
	slot       int
	name       string     // the host end
	host, task netip.Addr // the host end's and the task's address
}

// forwardSysctl is the IPv4 forwarding switch of the agent's namespace.
const forwardSysctl = "/proc/sys/net/ipv4/ip_forward"

// newEgress sets up NetworkEgress for plan: it removes the links and table
// an earlier executor with the same ID left (the recovery after an agent's
// restart), creates the table, turns IPv4 forwarding on when it is off and
// writes the tasks' resolv.conf. The error wraps ErrIsolation and says what
// failed (no nf_tables, no CAP_NET_ADMIN).
func newEgress(plan *egressPlan) (_ *egress, err error) {
	e := &egress{plan: plan, used: make([]bool, plan.slots())}
	fail := func(what string, err error) error {
		return fmt.Errorf("%w: egress: %s: %w", ErrIsolation, what, err)
	}
	defer func() {
		if err != nil {
			_ = e.close()
		}
	}()
	if e.rt, err = netlink.NewHandle(unix.NETLINK_ROUTE); err != nil {
		return nil, fail("a netlink socket", err)
	}
	if err := e.removeStaleLinks(); err != nil {
		return nil, fail("removing the links of an earlier run", err)
	}
	if err := e.writeTable(); err != nil {
		return nil, fail("nftables table "+plan.table, err)
	}
	on, err := os.ReadFile(forwardSysctl)
	if err != nil {
		return nil, fail("reading "+forwardSysctl, err)
	}
	if strings.TrimSpace(string(on)) != "1" {
		// Forwarding is a switch of the whole namespace, which the kernel
		// counts no users of; it stays on after Close, since another agent
		// on the host, or the node's routing, may depend on it by then.
		// In a pod's network namespace it concerns that pod alone.
		if err := os.WriteFile(forwardSysctl, []byte("1\n"), 0o644); err != nil {
			return nil, fail("turning on IPv4 forwarding ("+forwardSysctl+")", err)
		}
	}
	if e.resolvDir, err = os.MkdirTemp("", "bashtask-egress-"); err != nil {
		return nil, fail("resolv.conf", err)
	}
	e.resolvPath = filepath.Join(e.resolvDir, "resolv.conf")
	if err := os.WriteFile(e.resolvPath, plan.resolv, 0o644); err != nil {
		return nil, fail("resolv.conf", err)
	}
	return e, nil
}

// dumpRetries bounds the retries of a netlink dump that the kernel
// interrupted because links changed while it ran (NLM_F_DUMP_INTR): on a
// node where other tasks' veth pairs come and go, one dump in a while is.
const dumpRetries = 10

// linkList is netlink.LinkList, retried while the kernel says the dump was
// interrupted: an interrupted dump may miss links, and a stale link missed
// here would keep its slot's addresses taken.
func linkList() ([]netlink.Link, error) {
	for i := 0; ; i++ {
		links, err := netlink.LinkList()
		if !errors.Is(err, netlink.ErrDumpInterrupted) || i == dumpRetries {
			return links, err
		}
	}
}

// removeStaleLinks deletes every link whose name has the plan's prefix and
// a slot number after it: the host ends left by an earlier run. Deleting a
// veth end deletes its peer in the task's namespace too.
func (e *egress) removeStaleLinks() error {
	links, err := linkList()
	if err != nil {
		return err
	}
	var errs []error
	for _, l := range links {
		name := l.Attrs().Name
		rest, ok := strings.CutPrefix(name, e.plan.prefix)
		if !ok || rest == "" || strings.Trim(rest, "0123456789abcdef") != "" || l.Type() != "veth" {
			continue
		}
		if err := netlink.LinkDel(l); err != nil && !errors.Is(err, unix.ENODEV) {
			errs = append(errs, fmt.Errorf("deleting %s: %w", name, err))
		}
	}
	return errors.Join(errs...)
}

// writeTable replaces the agent's table with a fresh one, in one
// transaction: a table an earlier run left is deleted in the same batch.
func (e *egress) writeTable() error {
	c, err := nftables.New()
	if err != nil {
		return err
	}
	p := e.plan
	t := &nftables.Table{Family: nftables.TableFamilyINet, Name: p.table}
	// Adding then deleting leaves no error when the table did not exist.
	c.AddTable(t)
	c.DelTable(t)
	c.AddTable(t)
	accept := nftables.ChainPolicyAccept
	input := c.AddChain(&nftables.Chain{Name: "input", Table: t, Type: nftables.ChainTypeFilter, Hooknum: nftables.ChainHookInput, Priority: nftables.ChainPriorityFilter, Policy: &accept})
	forward := c.AddChain(&nftables.Chain{Name: "forward", Table: t, Type: nftables.ChainTypeFilter, Hooknum: nftables.ChainHookForward, Priority: nftables.ChainPriorityFilter, Policy: &accept})
	// The workspaces' egress policies (egressGuard) hang from these.
	policy := c.AddChain(&nftables.Chain{Name: egressPolicyChain, Table: t})
	policyDNS := c.AddChain(&nftables.Chain{Name: egressPolicyDNSChain, Table: t})
	// Connections to intercepted names go to the guards' proxies
	// (egressProxy) from here.
	pre := c.AddChain(&nftables.Chain{Name: "prerouting", Table: t, Type: nftables.ChainTypeNAT, Hooknum: nftables.ChainHookPrerouting, Priority: nftables.ChainPriorityNATDest, Policy: &accept})
	policyNAT := c.AddChain(&nftables.Chain{Name: egressPolicyNATChain, Table: t})
	post := c.AddChain(&nftables.Chain{Name: "postrouting", Table: t, Type: nftables.ChainTypeNAT, Hooknum: nftables.ChainHookPostrouting, Priority: nftables.ChainPriorityNATSource, Policy: &accept})
	rule := func(ch *nftables.Chain, exprs ...[]expr.Any) {
		var all []expr.Any
		for _, e := range exprs {
			all = append(all, e...)
		}
		c.AddRule(&nftables.Rule{Table: t, Chain: ch, Exprs: all})
	}
	fromTask := ifname(expr.MetaKeyIIFNAME, p.prefix, true)
	toTask := ifname(expr.MetaKeyOIFNAME, p.prefix, true)
	accepted, dropped := verdict(expr.VerdictAccept), verdict(expr.VerdictDrop)

	// input: DNS to a resolver that is an address of this namespace, else
	// nothing from a task reaches the host.
	for _, r := range p.resolvers {
		for _, proto := range []byte{unix.IPPROTO_UDP, unix.IPPROTO_TCP} {
			rule(input, fromTask, ipv4Dst(netip.PrefixFrom(r, 32)), dport(proto, 53), accepted)
		}
	}
	rule(input, fromTask, jump(policyDNS))
	rule(input, fromTask, dropped)

	// forward: no task to task, no IPv6, DNS to the resolvers, no denied
	// range; replies only towards tasks.
	rule(forward, fromTask, toTask, dropped)
	rule(forward, fromTask, nfproto(unix.NFPROTO_IPV6), dropped)
	rule(forward, fromTask, jump(policy))
	for _, r := range p.resolvers {
		for _, proto := range []byte{unix.IPPROTO_UDP, unix.IPPROTO_TCP} {
			rule(forward, fromTask, ipv4Dst(netip.PrefixFrom(r, 32)), dport(proto, 53), accepted)
		}
	}
	for _, d := range p.denied() {
		rule(forward, fromTask, ipv4Dst(d), dropped)
	}
	rule(forward, fromTask, accepted)
	rule(forward, toTask, ctReply(), accepted)
	rule(forward, toTask, dropped)

	rule(pre, fromTask, jump(policyNAT))

	// postrouting: the task range goes out behind the outgoing interface's
	// address.
	rule(post, ipv4Src(p.cidr), ifname(expr.MetaKeyOIFNAME, p.prefix, false), []expr.Any{&expr.Masq{}})
	return c.Flush()
}

// denied are the forward chain's denied ranges: the built-in ones, the
// task range and the configured ones.
func (p *egressPlan) denied() []netip.Prefix {
	out := append([]netip.Prefix(nil), BuiltinEgressDeny...)
	out = append(out, p.cidr)
	return append(out, p.deny...)
}

// ifname matches (eq) or does not match the interface name prefix: the
// comparison of only the prefix's bytes is nftables' "prefix*" wildcard.
func ifname(key expr.MetaKey, prefix string, eq bool) []expr.Any {
	op := expr.CmpOpEq
	if !eq {
		op = expr.CmpOpNeq
	}
	return []expr.Any{&expr.Meta{Key: key, Register: 1}, &expr.Cmp{Op: op, Register: 1, Data: []byte(prefix)}}
}

func nfproto(proto byte) []expr.Any {
	return []expr.Any{&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 1}, &expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{proto}}}
}

// ipv4Addr matches an IPv4 packet whose address at offset (12 source, 16
// destination) lies in pfx.
func ipv4Addr(offset uint32, pfx netip.Prefix) []expr.Any {
	mask := net.CIDRMask(pfx.Bits(), 32)
	network := pfx.Masked().Addr().As4()
	return append(nfproto(unix.NFPROTO_IPV4),
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: offset, Len: 4},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: mask, Xor: make([]byte, 4)},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: network[:]},
	)
}

func ipv4Dst(pfx netip.Prefix) []expr.Any { return ipv4Addr(16, pfx) }
func ipv4Src(pfx netip.Prefix) []expr.Any { return ipv4Addr(12, pfx) }

// dport matches transport protocol proto to destination port port.
func dport(proto byte, port uint16) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{proto}},
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binaryutil.BigEndian.PutUint16(port)},
	}
}

// ctReply matches packets of a connection conntrack has seen both ways, or
// related to one (ICMP errors).
func ctReply() []expr.Any {
	return []expr.Any{
		&expr.Ct{Register: 1, Key: expr.CtKeySTATE},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4,
			Mask: binaryutil.NativeEndian.PutUint32(expr.CtStateBitESTABLISHED | expr.CtStateBitRELATED), Xor: make([]byte, 4)},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: make([]byte, 4)},
	}
}

func verdict(k expr.VerdictKind) []expr.Any { return []expr.Any{&expr.Verdict{Kind: k}} }

func jump(ch *nftables.Chain) []expr.Any {
	return []expr.Any{&expr.Verdict{Kind: expr.VerdictJump, Chain: ch.Name}}
}

// close deletes the table and every task link left, and the resolv.conf.
func (e *egress) close() error {
	e.releasing.Wait()
	var errs []error
	if c, err := nftables.New(); err == nil {
		t := &nftables.Table{Family: nftables.TableFamilyINet, Name: e.plan.table}
		c.AddTable(t)
		c.DelTable(t)
		if err := c.Flush(); err != nil {
			errs = append(errs, fmt.Errorf("deleting nftables table %s: %w", e.plan.table, err))
		}
	}
	if err := e.removeStaleLinks(); err != nil {
		errs = append(errs, err)
	}
	if e.resolvDir != "" {
		errs = append(errs, os.RemoveAll(e.resolvDir))
	}
	if e.rt != nil {
		e.rt.Close()
		e.rt = nil
	}
	return errors.Join(errs...)
}

// take reserves a free slot.
func (e *egress) take() (int, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	n := len(e.used)
	for i := range n {
		s := (e.next + i) % n
		if !e.used[s] {
			e.used[s], e.next = true, (s+1)%n
			return s, nil
		}
	}
	return 0, fmt.Errorf("all %d task addresses of %s are in use", n, e.plan.cidr)
}

func (e *egress) free(slot int) {
	e.mu.Lock()
	e.used[slot] = false
	e.mu.Unlock()
}

// attach gives the network namespace of process pid (new, with only lo)
// its veth pair: the host end with its address up in the agent's
// namespace, the task end as EgressTaskLink with the task's address, up,
// and the default route to the host end. On error nothing is left.
func (e *egress) attach(pid int) (*egressLink, error) {
	ns, err := netns.GetFromPid(pid)
	if err != nil {
		return nil, fmt.Errorf("the network namespace of %d: %w", pid, err)
	}
	defer ns.Close()
	return e.attachNS(ns)
}

// attachNS gives the network namespace ns (with only lo) its veth pair,
// as attach does for a process's; a workspace's namespace holds it for
// the workspace's life.
func (e *egress) attachNS(ns netns.NsHandle) (_ *egressLink, err error) {
	slot, err := e.take()
	if err != nil {
		return nil, err
	}
	l := &egressLink{e: e, slot: slot, name: e.plan.linkName(slot)}
	l.host, l.task = e.plan.slotAddrs(slot)
	defer func() {
		if err != nil {
			l.release()
		}
	}()
	veth := &netlink.Veth{
		LinkAttrs: netlink.LinkAttrs{Name: l.name},
		PeerName:  EgressTaskLink, PeerNamespace: netlink.NsFd(int(ns)),
	}
	rt := e.handle()
	if err := rt.LinkAdd(veth); err != nil {
		return nil, fmt.Errorf("adding veth %s: %w", l.name, err)
	}
	// No IPv6 address on the host end: no link-local address a task
	// could reach (nothing from a task link reaches the host's input, of
	// either family, anyway). The address generation mode set through
	// netlink, not disable_ipv6 in /proc/sys: that write spins on the
	// routing lock while another link is being removed, a millisecond
	// of the agent's CPU per task and more (docs/performance.md). A
	// kernel without IPv6 refuses the attribute.
	if err := rt.LinkSetIP6AddrGenMode(veth, nl.IN6_ADDR_GEN_MODE_NONE); err != nil && !ipv6Missing(err) {
		return nil, fmt.Errorf("no IPv6 address on %s: %w", l.name, err)
	}
	if err := rt.AddrAdd(veth, addr(l.host)); err != nil {
		return nil, fmt.Errorf("addressing %s: %w", l.name, err)
	}
	if err := rt.LinkSetUp(veth); err != nil {
		return nil, fmt.Errorf("bringing %s up: %w", l.name, err)
	}
	h, err := netlink.NewHandleAt(ns, unix.NETLINK_ROUTE)
	if err != nil {
		return nil, fmt.Errorf("netlink in the task's namespace: %w", err)
	}
	defer h.Close()
	peer, err := h.LinkByName(EgressTaskLink)
	if err != nil {
		return nil, fmt.Errorf("the task's end of %s: %w", l.name, err)
	}
	if err := h.AddrAdd(peer, addr(l.task)); err != nil {
		return nil, fmt.Errorf("addressing the task's end of %s: %w", l.name, err)
	}
	if err := h.LinkSetUp(peer); err != nil {
		return nil, fmt.Errorf("bringing the task's end of %s up: %w", l.name, err)
	}
	if err := h.RouteAdd(&netlink.Route{LinkIndex: peer.Attrs().Index, Gw: net.IP(l.host.AsSlice())}); err != nil {
		return nil, fmt.Errorf("the task's default route via %s: %w", l.host, err)
	}
	return l, nil
}

// ipv6Missing reports whether err is a kernel's without IPv6 refusing an
// IPv6 attribute.
func ipv6Missing(err error) bool {
	return errors.Is(err, unix.EAFNOSUPPORT) || errors.Is(err, unix.EOPNOTSUPP)
}

func addr(a netip.Addr) *netlink.Addr {
	return &netlink.Addr{IPNet: &net.IPNet{IP: a.AsSlice(), Mask: net.CIDRMask(32-egressSlotBits, 32)}}
}

// release deletes the pair (the task's end goes with the host's) and then
// frees the slot, in the background: unregistering a network device waits
// for RCU grace periods, tens of milliseconds a task's Result need not
// wait for, and the slot (the link's name and addresses) is reused only
// once the device is gone. It is safe on nil and more than once.
func (l *egressLink) release() {
	if l == nil || l.e == nil {
		return
	}
	e, name, slot := l.e, l.name, l.slot
	l.e = nil
	e.releasing.Add(1)
	go func() {
		defer e.releasing.Done()
		rt := e.handle()
		if link, err := rt.LinkByName(name); err == nil {
			_ = rt.LinkDel(link)
		}
		e.free(slot)
	}()
}
