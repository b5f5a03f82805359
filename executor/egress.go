package executor

import (
	"bufio"
	"bytes"
	"fmt"
	"net/netip"
	"regexp"
	"slices"
	"strings"
)

// Defaults of NetworkEgress.
const (
	// DefaultEgressCIDR is the private range task addresses come from: the
	// start of the shared address space of RFC 6598, which neither a
	// cluster's pod and service ranges nor the public internet use by
	// convention. Each task takes a /30 of it (16384 tasks at once).
	DefaultEgressCIDR = "100.64.0.0/16"
	// EgressLinkPrefix starts the name of every host end of a task's veth
	// pair; the agent's own links are EgressLinkPrefix + [EgressConfig.ID]
	// followed by a slot number in hex. nftables matches them with a
	// wildcard interface name.
	EgressLinkPrefix = "bt"
	// EgressTablePrefix starts the name of the agent's nftables table
	// (family inet): EgressTablePrefix + [EgressConfig.ID].
	EgressTablePrefix = "bashtask-"
	// EgressTaskLink is the name of the task's end of its veth pair, in
	// the task's network namespace.
	EgressTaskLink = "eth0"
)

// egressSlotBits is the size of a task's block: a /30 holds the host's end,
// the task's end, a network and a broadcast address (no /31 special case
// needed on either side).
const egressSlotBits = 2

// maxEgressSlots bounds the slots of one agent: four hex digits after the
// prefix keep a link name within the kernel's 15 bytes (IFNAMSIZ - 1).
const maxEgressSlots = 1 << 16

// BuiltinEgressDeny are the destinations no task of NetworkEgress reaches
// whatever the configuration says: "this network", loopback, link-local
// (169.254.169.254 is the metadata service of most clouds), multicast and
// the limited broadcast address. IPv6 is not routed at all.
var BuiltinEgressDeny = []netip.Prefix{
	netip.MustParsePrefix("0.0.0.0/8"),
	netip.MustParsePrefix("127.0.0.0/8"),
	netip.MustParsePrefix("169.254.0.0/16"),
	netip.MustParsePrefix("224.0.0.0/4"),
	netip.MustParsePrefix("255.255.255.255/32"),
}

// EgressConfig is the node-level configuration of [NetworkEgress] (agent
// flags --egress-*). Each task gets a network namespace with a veth pair
// to the agent's network namespace, a /30 of CIDR, a default route to the
// host's end and NAT (nftables masquerade) behind the agent's address.
// Only IPv4 is routed: a task has no IPv6 address but link-local and no
// IPv6 route, and IPv6 from a task's link is dropped.
type EgressConfig struct {
	// ID tells this executor's links and nftables table from those of
	// another agent on the same host (tests, or two agents with separate
	// state directories): 1 to 8 of [a-z0-9], stable across restarts of
	// one agent so that its recovery finds what an earlier run left.
	ID string
	// CIDR is the IPv4 range of task addresses, prefix length 14 to 28;
	// empty means DefaultEgressCIDR. It must not overlap the node's
	// networks or a range tasks must reach.
	CIDR string
	// Deny lists IPv4 CIDRs tasks must not reach besides BuiltinEgressDeny
	// and CIDR itself: the cluster's pod and service ranges, the node
	// network. A resolver in a denied range stays reachable on port 53.
	Deny []string
	// Resolvers are the IPv4 addresses of the DNS servers tasks get in
	// their /etc/resolv.conf (a read-only bind) and may reach on port 53
	// (UDP and TCP) even inside a denied range. A loopback resolver is an
	// error: a task's network namespace has its own loopback. Empty gives
	// tasks a resolv.conf without nameservers: no DNS.
	Resolvers []string
	// Search and Options are the search and options lines of the tasks'
	// resolv.conf (as in the agent's own, see ParseResolvConf).
	Search, Options []string
}

// egressPlan is an EgressConfig parsed and checked.
type egressPlan struct {
	id        string
	prefix    string // host link names start with it
	table     string
	cidr      netip.Prefix
	deny      []netip.Prefix
	resolvers []netip.Addr
	resolv    []byte // the tasks' resolv.conf
}

var validEgressID = regexp.MustCompile(`^[a-z0-9]{1,8}$`)

// planEgress checks c. Errors wrap ErrInvalidConfig and name the field.
func planEgress(c EgressConfig) (*egressPlan, error) {
	bad := func(format string, a ...any) error {
		return fmt.Errorf("%w: egress: %s", ErrInvalidConfig, fmt.Sprintf(format, a...))
	}
	if !validEgressID.MatchString(c.ID) {
		return nil, bad("id %q is not 1 to 8 of [a-z0-9]", c.ID)
	}
	p := &egressPlan{id: c.ID, prefix: EgressLinkPrefix + c.ID, table: EgressTablePrefix + c.ID}
	cidr := c.CIDR
	if cidr == "" {
		cidr = DefaultEgressCIDR
	}
	pfx, err := netip.ParsePrefix(cidr)
	switch {
	case err != nil:
		return nil, bad("cidr: %v", err)
	case !pfx.Addr().Is4():
		return nil, bad("cidr %s is not IPv4 (tasks get no IPv6 route)", cidr)
	case pfx.Bits() < 14 || pfx.Bits() > 28:
		return nil, bad("cidr %s: prefix length %d is not between 14 and 28", cidr, pfx.Bits())
	}
	p.cidr = pfx.Masked()
	for _, b := range BuiltinEgressDeny {
		if b.Overlaps(p.cidr) {
			return nil, bad("cidr %s overlaps the always denied %s", cidr, b)
		}
	}
	for _, d := range c.Deny {
		dp, err := netip.ParsePrefix(d)
		if err != nil {
			if a, aerr := netip.ParseAddr(d); aerr == nil {
				dp, err = a.Prefix(a.BitLen())
			}
		}
		switch {
		case err != nil:
			return nil, bad("deny %q: %v", d, err)
		case !dp.Addr().Is4():
			// IPv6 is never routed for tasks: nothing to deny.
			continue
		}
		p.deny = append(p.deny, dp.Masked())
	}
	var resolv bytes.Buffer
	resolv.WriteString("# Written by bashtask-agent for tasks of network Egress.\n")
	for _, r := range c.Resolvers {
		a, err := netip.ParseAddr(r)
		switch {
		case err != nil:
			return nil, bad("resolver %q: %v", r, err)
		case a.IsLoopback():
			return nil, bad("resolver %s is a loopback address, which a task's network namespace cannot reach (it has a loopback of its own); name the upstream resolver instead (systemd-resolved lists it in /run/systemd/resolve/resolv.conf)", a)
		case !a.Is4():
			return nil, bad("resolver %s is not IPv4 (tasks get no IPv6 route)", a)
		case p.cidr.Contains(a):
			return nil, bad("resolver %s is inside the task range %s", a, p.cidr)
		}
		p.resolvers = append(p.resolvers, a)
		fmt.Fprintf(&resolv, "nameserver %s\n", a)
	}
	for _, list := range []struct {
		key  string
		vals []string
	}{{"search", c.Search}, {"options", c.Options}} {
		if len(list.vals) == 0 {
			continue
		}
		for _, v := range list.vals {
			if strings.ContainsAny(v, " \t\n") {
				return nil, bad("resolv.conf %s %q contains white space", list.key, v)
			}
		}
		fmt.Fprintf(&resolv, "%s %s\n", list.key, strings.Join(list.vals, " "))
	}
	p.resolv = resolv.Bytes()
	return p, nil
}

// slots is how many tasks the plan's CIDR holds at once.
func (p *egressPlan) slots() int {
	return min(1<<(32-p.cidr.Bits()-egressSlotBits), maxEgressSlots)
}

// slotAddrs are the host's and the task's address of slot i.
func (p *egressPlan) slotAddrs(i int) (host, task netip.Addr) {
	b := p.cidr.Addr().As4()
	base := uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3])
	base += uint32(i) << egressSlotBits
	at := func(off uint32) netip.Addr {
		v := base + off
		return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
	}
	return at(1), at(2)
}

// linkName is the host end of slot i's veth pair.
func (p *egressPlan) linkName(i int) string { return fmt.Sprintf("%s%x", p.prefix, i) }

// ResolvConf holds what a resolv.conf file says (resolv.conf(5)).
type ResolvConf struct {
	// Nameservers are the addresses of the nameserver lines, in order.
	Nameservers []string
	// Search are the domains of the last search (or domain) line.
	Search []string
	// Options are the words of the options lines.
	Options []string
}

// ParseResolvConf reads the nameserver, search, domain and options lines
// of a resolv.conf file; other lines and comments are skipped.
func ParseResolvConf(data []byte) ResolvConf {
	var rc ResolvConf
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 2 || strings.HasPrefix(f[0], "#") || strings.HasPrefix(f[0], ";") {
			continue
		}
		switch f[0] {
		case "nameserver":
			rc.Nameservers = append(rc.Nameservers, f[1])
		case "search", "domain":
			rc.Search = slices.Clone(f[1:])
		case "options":
			rc.Options = append(rc.Options, f[1:]...)
		}
	}
	return rc
}

// Validate checks c as New would; the error wraps ErrInvalidConfig and
// names the field.
func (c EgressConfig) Validate() error {
	_, err := planEgress(c)
	return err
}
