//go:build linux

// Package upstream is a stand-in for the internet on one Linux host, for
// the tests, benchmarks and demo of network Egress (docs/egress.md): a
// network namespace of its own with a veth pair to the caller's
// namespace, a /30 of the benchmark range 198.18.0.0/15 (RFC 2544, never
// routed on the internet) across the pair, and a DNS server inside that
// answers the names under given domains with the namespace's address. No
// packet sent to it leaves the machine. It needs root (CAP_NET_ADMIN and
// CAP_SYS_ADMIN for the namespace).
package upstream

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"runtime"
	"strings"

	"github.com/miekg/dns"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
)

// Slots is how many /30 networks 198.18.0.0/15 holds: the valid range of
// Config.Slot is [0, Slots).
const Slots = 1 << 15

// Config says which upstream to make.
type Config struct {
	// Name names the network namespace, /run/netns/<Name>; it must be
	// unique on the host.
	Name string
	// Link is the host end's interface name, at most 15 bytes (the
	// kernel's IFNAMSIZ less its NUL); the end inside is eth0.
	Link string
	// Slot picks the /30 of 198.18.0.0/15: the host end gets its first
	// address, the namespace the second. Two upstreams on a host need
	// different slots.
	Slot int
	// Domains are the DNS names (without the trailing dot) the resolver
	// answers, with each name under them: an A query for one gets the
	// namespace's address, with a TTL of 300 s. Other names get NXDOMAIN.
	// Empty starts no resolver.
	Domains []string
}

// Upstream is a running stand-in for the internet. Close removes it.
type Upstream struct {
	// NS is the network namespace; run code in it with InNetns.
	NS netns.NsHandle
	// Addr is the namespace's address on the pair: the servers' and the
	// resolver's (UDP port 53).
	Addr netip.Addr
	// HostSide is the caller's address on the pair.
	HostSide netip.Addr

	name string
	link netlink.Link
	dns  *dns.Server
}

// Start makes the namespace, the pair and the resolver. It returns an
// error naming the step that failed, having undone the ones before.
func Start(cfg Config) (_ *Upstream, err error) {
	if cfg.Slot < 0 || cfg.Slot >= Slots {
		return nil, fmt.Errorf("upstream: slot %d is outside [0, %d)", cfg.Slot, Slots)
	}
	if len(cfg.Link) == 0 || len(cfg.Link) > 15 {
		return nil, fmt.Errorf("upstream: link name %q must be 1 to 15 bytes (IFNAMSIZ)", cfg.Link)
	}
	u := &Upstream{name: cfg.Name, NS: -1, HostSide: SlotAddr(cfg.Slot, 1), Addr: SlotAddr(cfg.Slot, 2)}
	defer func() {
		if err != nil {
			u.Close()
		}
	}()
	if u.NS, err = NewNamedNetns(cfg.Name); err != nil {
		return nil, fmt.Errorf("upstream: network namespace %s: %w", cfg.Name, err)
	}
	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: cfg.Link}, PeerName: "eth0", PeerNamespace: netlink.NsFd(int(u.NS))}
	if err := netlink.LinkAdd(veth); err != nil {
		return nil, fmt.Errorf("upstream: veth pair %s: %w", cfg.Link, err)
	}
	u.link = veth
	if err := addrUp(nil, cfg.Link, u.HostSide); err != nil {
		return nil, err
	}
	h, err := netlink.NewHandleAt(u.NS)
	if err != nil {
		return nil, fmt.Errorf("upstream: netlink in %s: %w", cfg.Name, err)
	}
	defer h.Close()
	if err := addrUp(h, "eth0", u.Addr); err != nil {
		return nil, err
	}
	lo, err := h.LinkByName("lo")
	if err == nil {
		err = h.LinkSetUp(lo)
	}
	if err != nil {
		return nil, fmt.Errorf("upstream: loopback in %s: %w", cfg.Name, err)
	}
	if len(cfg.Domains) > 0 {
		if err := u.serveDNS(cfg.Domains); err != nil {
			return nil, err
		}
	}
	return u, nil
}

// SlotAddr is address off (0 to 3) of the /30 numbered slot in
// 198.18.0.0/15.
func SlotAddr(slot, off int) netip.Addr {
	v := uint32(198)<<24 | uint32(18)<<16 | uint32(slot%Slots)<<2 | uint32(off&3)
	return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
}

// addrUp gives link name (through h, nil for the caller's namespace) the
// /30 address a and brings it up.
func addrUp(h *netlink.Handle, name string, a netip.Addr) error {
	if h == nil {
		var err error
		if h, err = netlink.NewHandle(); err != nil {
			return err
		}
		defer h.Close()
	}
	l, err := h.LinkByName(name)
	if err != nil {
		return fmt.Errorf("upstream: link %s: %w", name, err)
	}
	if err := h.AddrAdd(l, &netlink.Addr{IPNet: &net.IPNet{IP: a.AsSlice(), Mask: net.CIDRMask(30, 32)}}); err != nil {
		return fmt.Errorf("upstream: address %s on %s: %w", a, name, err)
	}
	return h.LinkSetUp(l)
}

// Listen opens a TCP listener on port of Addr, inside the namespace.
func (u *Upstream) Listen(port int) (net.Listener, error) {
	var l net.Listener
	err := InNetns(u.NS, func() (err error) {
		l, err = net.Listen("tcp4", netip.AddrPortFrom(u.Addr, uint16(port)).String())
		return err
	})
	return l, err
}

// serveDNS starts the resolver on UDP port 53 of Addr. A socket on the
// wildcard address would answer from the address of the route back.
func (u *Upstream) serveDNS(domains []string) error {
	var pc net.PacketConn
	if err := InNetns(u.NS, func() (err error) {
		pc, err = net.ListenPacket("udp4", netip.AddrPortFrom(u.Addr, 53).String())
		return err
	}); err != nil {
		return fmt.Errorf("upstream: resolver on %s:53: %w", u.Addr, err)
	}
	answer := u.Addr.AsSlice()
	u.dns = &dns.Server{PacketConn: pc, Handler: dns.HandlerFunc(func(w dns.ResponseWriter, r *dns.Msg) {
		m := new(dns.Msg)
		m.SetReply(r)
		m.Authoritative = true
		if len(r.Question) == 0 || !under(r.Question[0].Name, domains) {
			m.Rcode = dns.RcodeNameError
		} else if q := r.Question[0]; q.Qtype == dns.TypeA {
			m.Answer = append(m.Answer, &dns.A{Hdr: dns.RR_Header{Name: q.Name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 300}, A: answer})
		}
		_ = w.WriteMsg(m)
	})}
	go func() { _ = u.dns.ActivateAndServe() }()
	return nil
}

// under reports whether the query name fqdn (with its trailing dot) is one
// of domains or a name under one.
func under(fqdn string, domains []string) bool {
	name := strings.ToLower(strings.TrimSuffix(fqdn, "."))
	for _, d := range domains {
		if name == d || strings.HasSuffix(name, "."+d) {
			return true
		}
	}
	return false
}

// Close stops the resolver and removes the pair and the namespace.
// Listeners opened with Listen are the caller's to close.
func (u *Upstream) Close() {
	if u.dns != nil {
		_ = u.dns.Shutdown()
	}
	if u.link != nil {
		_ = netlink.LinkDel(u.link)
	}
	if u.NS >= 0 {
		u.NS.Close()
		_ = netns.DeleteNamed(u.name)
	}
}

// InNetns runs f on an OS thread switched to ns and returns f's error.
// Sockets f opens stay in ns. A thread that cannot be switched back stays
// locked, so the Go runtime ends it with its goroutine.
func InNetns(ns netns.NsHandle, f func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			errc <- err
			return
		}
		defer orig.Close()
		if err := netns.Set(ns); err != nil {
			errc <- err
			return
		}
		err = f()
		if netns.Set(orig) == nil {
			runtime.UnlockOSThread()
		}
		errc <- err
	}()
	return <-errc
}

// NewNamedNetns creates the network namespace /run/netns/<name> without
// moving the calling goroutine into it (netns.NewNamed switches the
// thread that calls it).
func NewNamedNetns(name string) (netns.NsHandle, error) {
	if name == "" {
		return -1, errors.New("upstream: empty network namespace name")
	}
	type result struct {
		ns  netns.NsHandle
		err error
	}
	c := make(chan result, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			c <- result{ns: -1, err: err}
			return
		}
		defer orig.Close()
		ns, err := netns.NewNamed(name)
		if err == nil && netns.Set(orig) == nil {
			runtime.UnlockOSThread()
		}
		c <- result{ns, err}
	}()
	r := <-c
	return r.ns, r.err
}
