//go:build linux

package executor

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"github.com/miekg/dns"
	"golang.org/x/sys/unix"
)

// egressGuard enforces one workspace's EgressPolicy (docs/egress.md): a
// DNS server on the host end of the workspace's veth pair (port 53, UDP
// and TCP) that answers only the names the policy allows, by forwarding
// them to the executor's resolvers, and an nftables chain of the
// agent's table that, under DefaultDeny, lets the workspace's new
// connections go only to an address an allowed name resolved to: the
// chain w<slot> looks the destination up in the sets a<slot> (address,
// any port and protocol) and p<slot> (address . port, TCP and UDP), which
// the DNS server fills before it answers and the guard empties as the
// answers' TTLs (at least egressMinTTL) run out. Packets of a connection
// conntrack knows (established or related) pass, so that a policy change
// leaves open connections open. The forward chain of the table jumps to
// the chain "policy", where a rule per guarded link jumps to its w<slot>;
// the input chain jumps to "policydns", where rules per guarded link let
// DNS to the host end through.
type egressGuard struct {
	e          *egress
	link       *egressLink
	tag        []byte // UserData of the guard's rules in the shared chains
	chain      string
	addrSet    *nftables.Set
	portSet    *nftables.Set
	icptSet    *nftables.Set // addresses of intercepted names, port 443 to the proxy
	resolvPath string        // the workspace's resolv.conf, naming the host end
	servers    []*dns.Server
	stop       chan struct{}
	stopped    sync.WaitGroup

	mu        sync.Mutex
	policy    EgressPolicy
	onRefused func(EgressRefusal)
	proxy     *egressProxy                        // once the policy had injection rules
	resolved  map[string]map[netip.Addr]time.Time // allowed name -> address -> expiry
	have      map[egressKey]bool                  // the sets' elements
	closed    bool
}

// egressKey is an element of a guard's sets: port 0 is the address set's,
// intercept the intercepted addresses'.
type egressKey struct {
	addr      netip.Addr
	port      uint16
	intercept bool
}

// egressMinTTL is the shortest time an answer's addresses stay in the
// sets: a TTL of 0 or 1 would expire before the client connects.
const egressMinTTL = 5 * time.Second

// egressUpstreamTimeout bounds one forwarded query.
const egressUpstreamTimeout = 3 * time.Second

// Chains of the agent's table the guards hang from.
const (
	egressPolicyChain    = "policy"
	egressPolicyDNSChain = "policydns"
	egressPolicyNATChain = "policynat"
)

// guard starts enforcing p on the workspace link l: the nftables objects,
// the resolv.conf and the DNS server. On error nothing is left.
func (e *egress) guard(l *egressLink, p EgressPolicy, onRefused func(EgressRefusal)) (_ *egressGuard, err error) {
	g := &egressGuard{
		e: e, link: l, tag: []byte("bashtask-guard:" + l.name), chain: fmt.Sprintf("w%x", l.slot),
		onRefused: onRefused, stop: make(chan struct{}), policy: p,
		resolved: map[string]map[netip.Addr]time.Time{}, have: map[egressKey]bool{},
	}
	defer func() {
		if err != nil {
			g.close()
		}
	}()
	if err := g.addTables(); err != nil {
		return nil, fmt.Errorf("nftables of the egress policy: %w", err)
	}
	if err := g.writeResolvConf(); err != nil {
		return nil, err
	}
	if err := g.serve(); err != nil {
		return nil, err
	}
	if err := g.startProxy(); err != nil {
		return nil, err
	}
	g.stopped.Add(1)
	go g.sweep()
	return g, nil
}

func (g *egressGuard) table() *nftables.Table {
	return &nftables.Table{Family: nftables.TableFamilyINet, Name: g.e.plan.table}
}

// addTables makes the sets, the chain with the policy's rules, and the
// jumps to it and the DNS exception in the shared chains, in one batch.
func (g *egressGuard) addTables() error {
	c, err := nftables.New()
	if err != nil {
		return err
	}
	t := g.table()
	g.addrSet = &nftables.Set{Table: t, Name: "a" + g.chain[1:], KeyType: nftables.TypeIPAddr}
	g.portSet = &nftables.Set{Table: t, Name: "p" + g.chain[1:], Concatenation: true,
		KeyType: nftables.MustConcatSetType(nftables.TypeIPAddr, nftables.TypeInetService)}
	g.icptSet = &nftables.Set{Table: t, Name: "i" + g.chain[1:], KeyType: nftables.TypeIPAddr}
	for _, s := range []*nftables.Set{g.addrSet, g.portSet, g.icptSet} {
		if err := c.AddSet(s, nil); err != nil {
			return err
		}
	}
	ch := c.AddChain(&nftables.Chain{Name: g.chain, Table: t})
	g.policyRules(c, ch)
	fromLink := ifnameExact(expr.MetaKeyIIFNAME, g.link.name)
	c.AddRule(&nftables.Rule{Table: t, Chain: &nftables.Chain{Name: egressPolicyChain, Table: t}, UserData: g.tag,
		Exprs: join(fromLink, []expr.Any{&expr.Verdict{Kind: expr.VerdictJump, Chain: g.chain}})})
	for _, proto := range []byte{unix.IPPROTO_UDP, unix.IPPROTO_TCP} {
		c.AddRule(&nftables.Rule{Table: t, Chain: &nftables.Chain{Name: egressPolicyDNSChain, Table: t}, UserData: g.tag,
			Exprs: join(fromLink, ipv4Dst(netip.PrefixFrom(g.link.host, 32)), dport(proto, 53), verdict(expr.VerdictAccept))})
	}
	g.interceptRules(c, fromLink)
	return c.Flush()
}

// interceptRules redirect the link's TCP to port 443 of an intercepted
// address to the proxy's port on the host end, and let it in.
func (g *egressGuard) interceptRules(c *nftables.Conn, fromLink []expr.Any) {
	t := g.table()
	c.AddRule(&nftables.Rule{Table: t, Chain: &nftables.Chain{Name: egressPolicyNATChain, Table: t}, UserData: g.tag,
		Exprs: join(fromLink, nfproto(unix.NFPROTO_IPV4), []expr.Any{
			&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 16, Len: 4},
			&expr.Lookup{SourceRegister: 1, SetName: g.icptSet.Name, SetID: g.icptSet.ID},
		}, dport(unix.IPPROTO_TCP, 443), []expr.Any{
			&expr.Immediate{Register: 1, Data: binaryutil.BigEndian.PutUint16(egressProxyPort)},
			&expr.Redir{RegisterProtoMin: 1},
		})})
	c.AddRule(&nftables.Rule{Table: t, Chain: &nftables.Chain{Name: egressPolicyDNSChain, Table: t}, UserData: g.tag,
		Exprs: join(fromLink, ipv4Dst(netip.PrefixFrom(g.link.host, 32)), dport(unix.IPPROTO_TCP, egressProxyPort), verdict(expr.VerdictAccept))})
}

// policyRules writes the chain's rules for g.policy: under DefaultDeny
// conntrack's known connections and the sets' destinations return to the
// forward chain (whose denied ranges still apply), the rest is counted
// and dropped; else the chain is empty and everything returns.
func (g *egressGuard) policyRules(c *nftables.Conn, ch *nftables.Chain) {
	if !g.policy.DefaultDeny {
		return
	}
	t, ret := g.table(), verdict(expr.VerdictReturn)
	add := func(exprs ...[]expr.Any) { c.AddRule(&nftables.Rule{Table: t, Chain: ch, Exprs: join(exprs...)}) }
	add(ctReply(), ret)
	add(ipv4Dst(netip.MustParsePrefix("0.0.0.0/0")), []expr.Any{
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 16, Len: 4},
		&expr.Lookup{SourceRegister: 1, SetName: g.addrSet.Name, SetID: g.addrSet.ID},
	}, ret)
	for _, proto := range []byte{unix.IPPROTO_TCP, unix.IPPROTO_UDP} {
		add(nfproto(unix.NFPROTO_IPV4), []expr.Any{
			&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{proto}},
			&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 16, Len: 4},
			&expr.Payload{DestRegister: 9, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
			&expr.Lookup{SourceRegister: 1, SetName: g.portSet.Name, SetID: g.portSet.ID},
		}, ret)
	}
	add([]expr.Any{&expr.Counter{}}, verdict(expr.VerdictDrop))
}

// join concatenates expression lists.
func join(exprs ...[]expr.Any) []expr.Any {
	var all []expr.Any
	for _, e := range exprs {
		all = append(all, e...)
	}
	return all
}

// ifnameExact matches the interface name exactly (the kernel's name
// register is zero-padded, so the NUL after name ends the match).
func ifnameExact(key expr.MetaKey, name string) []expr.Any {
	return []expr.Any{&expr.Meta{Key: key, Register: 1}, &expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: append([]byte(name), 0)}}
}

// writeResolvConf writes the workspace's resolv.conf: the host end as the
// only nameserver, with the executor's search and options lines.
func (g *egressGuard) writeResolvConf() error {
	var b strings.Builder
	fmt.Fprintf(&b, "# Written by bashtask-agent: the workspace's egress policy resolver.\nnameserver %s\n", g.link.host)
	for _, line := range strings.Split(string(g.e.plan.resolv), "\n") {
		if strings.HasPrefix(line, "search ") || strings.HasPrefix(line, "options ") {
			b.WriteString(line + "\n")
		}
	}
	g.resolvPath = filepath.Join(g.e.resolvDir, "resolv-"+g.link.name+".conf")
	if err := os.WriteFile(g.resolvPath, []byte(b.String()), 0o644); err != nil {
		return fmt.Errorf("the workspace's resolv.conf: %w", err)
	}
	return nil
}

// serve starts the DNS server on the host end's address, port 53, UDP
// and TCP.
func (g *egressGuard) serve() error {
	addr := netip.AddrPortFrom(g.link.host, 53).String()
	pc, err := net.ListenPacket("udp4", addr)
	if err != nil {
		return fmt.Errorf("the workspace's resolver on %s: %w", addr, err)
	}
	l, err := net.Listen("tcp4", addr)
	if err != nil {
		pc.Close()
		return fmt.Errorf("the workspace's resolver on %s/tcp: %w", addr, err)
	}
	g.servers = append(g.servers, &dns.Server{PacketConn: pc, Handler: g})
	g.servers = append(g.servers, &dns.Server{Listener: l, Handler: g})
	for _, s := range g.servers {
		started := make(chan struct{})
		s.NotifyStartedFunc = func() { close(started) }
		go func() { _ = s.ActivateAndServe() }()
		<-started
	}
	return nil
}

// setPolicy makes p the guard's policy: the chain's rules are rewritten
// and the sets follow p at once, in one batch.
func (g *egressGuard) setPolicy(p EgressPolicy, onRefused func(EgressRefusal)) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.policy, g.onRefused = p, onRefused
	if err := g.startProxyLocked(); err != nil {
		return err
	}
	c, err := nftables.New()
	if err != nil {
		return err
	}
	ch := &nftables.Chain{Name: g.chain, Table: g.table()}
	c.FlushChain(ch)
	g.policyRules(c, ch)
	if err := c.Flush(); err != nil {
		return fmt.Errorf("nftables of the egress policy: %w", err)
	}
	return g.syncLocked()
}

// sweep drops expired answers from the sets once a second until close.
func (g *egressGuard) sweep() {
	defer g.stopped.Done()
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		select {
		case <-g.stop:
			return
		case now := <-tick.C:
			g.mu.Lock()
			for name, addrs := range g.resolved {
				maps.DeleteFunc(addrs, func(_ netip.Addr, exp time.Time) bool { return now.After(exp) })
				if len(addrs) == 0 {
					delete(g.resolved, name)
				}
			}
			_ = g.syncLocked()
			g.mu.Unlock()
		}
	}
}

// record adds the addresses name resolved to, until expiry, and brings
// the sets up to date before the answer goes out.
func (g *egressGuard) record(name string, addrs []netip.Addr, ttl time.Duration) error {
	exp := time.Now().Add(max(ttl, egressMinTTL))
	g.mu.Lock()
	defer g.mu.Unlock()
	m := g.resolved[name]
	if m == nil {
		m = map[netip.Addr]time.Time{}
		g.resolved[name] = m
	}
	for _, a := range addrs {
		if exp.After(m[a]) {
			m[a] = exp
		}
	}
	return g.syncLocked()
}

// syncLocked makes the sets hold what the policy grants the names
// resolved: it adds and deletes the difference in one batch.
func (g *egressGuard) syncLocked() error {
	if g.closed {
		return nil
	}
	want := map[egressKey]bool{}
	for name, addrs := range g.resolved {
		if g.policy.injection(name) == nil || !g.policy.grant(name).allowed {
			continue
		}
		for a := range addrs {
			want[egressKey{addr: a, intercept: true}] = true
		}
	}
	if g.policy.DefaultDeny {
		for name, addrs := range g.resolved {
			gr := g.policy.grant(name)
			for a := range addrs {
				switch {
				case !gr.allowed:
				case gr.any:
					want[egressKey{addr: a}] = true
				default:
					for _, p := range gr.ports {
						want[egressKey{addr: a, port: p}] = true
					}
				}
			}
		}
	}
	add, del := map[*nftables.Set][]nftables.SetElement{}, map[*nftables.Set][]nftables.SetElement{}
	for k := range want {
		if !g.have[k] {
			s, e := g.setElement(k)
			add[s] = append(add[s], e)
		}
	}
	for k := range g.have {
		if !want[k] {
			s, e := g.setElement(k)
			del[s] = append(del[s], e)
		}
	}
	if len(add)+len(del) == 0 {
		return nil
	}
	c, err := nftables.New()
	if err != nil {
		return err
	}
	for _, op := range []struct {
		f    func(*nftables.Set, []nftables.SetElement) error
		s    *nftables.Set
		elem []nftables.SetElement
	}{{c.SetDeleteElements, g.addrSet, del[g.addrSet]}, {c.SetDeleteElements, g.portSet, del[g.portSet]}, {c.SetDeleteElements, g.icptSet, del[g.icptSet]},
		{c.SetAddElements, g.addrSet, add[g.addrSet]}, {c.SetAddElements, g.portSet, add[g.portSet]}, {c.SetAddElements, g.icptSet, add[g.icptSet]}} {
		if len(op.elem) > 0 {
			if err := op.f(op.s, op.elem); err != nil {
				return err
			}
		}
	}
	if err := c.Flush(); err != nil {
		return fmt.Errorf("egress policy sets: %w", err)
	}
	g.have = want
	return nil
}

// setElement is k's set and element.
func (g *egressGuard) setElement(k egressKey) (*nftables.Set, nftables.SetElement) {
	ip := k.addr.As4()
	switch {
	case k.intercept:
		return g.icptSet, nftables.SetElement{Key: ip[:]}
	case k.port == 0:
		return g.addrSet, nftables.SetElement{Key: ip[:]}
	}
	return g.portSet, nftables.SetElement{Key: append(ip[:], byte(k.port>>8), byte(k.port), 0, 0)}
}

// close stops the DNS server and the sweeper and deletes the guard's
// nftables objects and resolv.conf. Safe on a guard half made.
func (g *egressGuard) close() {
	for _, s := range g.servers {
		// Bounded: a query in flight may wait for an upstream resolver.
		ctx, cancel := context.WithTimeout(context.Background(), egressUpstreamTimeout)
		_ = s.ShutdownContext(ctx)
		cancel()
	}
	close(g.stop)
	g.stopped.Wait()
	g.mu.Lock()
	px := g.proxy
	g.mu.Unlock()
	px.close()
	g.mu.Lock()
	g.closed = true
	g.mu.Unlock()
	if g.resolvPath != "" {
		_ = os.Remove(g.resolvPath)
	}
	_ = g.deleteTables()
}

// deleteTables deletes the guard's rules in the shared chains (found by
// their UserData), its chain and its sets.
func (g *egressGuard) deleteTables() error {
	c, err := nftables.New()
	if err != nil {
		return err
	}
	t := g.table()
	for _, name := range []string{egressPolicyChain, egressPolicyDNSChain, egressPolicyNATChain} {
		rules, err := c.GetRules(t, &nftables.Chain{Name: name, Table: t})
		if err != nil {
			return err
		}
		for _, r := range rules {
			if string(r.UserData) == string(g.tag) {
				_ = c.DelRule(r)
			}
		}
	}
	if g.addrSet != nil {
		ch := &nftables.Chain{Name: g.chain, Table: t}
		c.FlushChain(ch)
		c.DelChain(ch)
		c.DelSet(g.addrSet)
		c.DelSet(g.portSet)
		c.DelSet(g.icptSet)
	}
	if err := c.Flush(); err != nil && !errors.Is(err, unix.ENOENT) {
		return err
	}
	return nil
}
