//go:build linux

package executor

import (
	"errors"
	"net/netip"
	"strings"
	"time"

	"github.com/miekg/dns"
)

// egressRefusalText is the extended DNS error's text (RFC 8914) of a
// refused name.
const egressRefusalText = "denied by the workspace's egress policy"

// ServeDNS answers one query of the workspace's resolver: a name the
// policy refuses gets NXDOMAIN (with the extended DNS error Blocked when
// the query has EDNS), an allowed one the upstream resolvers' answer,
// after the addresses of its A records are in the sets.
func (g *egressGuard) ServeDNS(w dns.ResponseWriter, r *dns.Msg) {
	if len(r.Question) != 1 {
		m := new(dns.Msg)
		m.SetRcode(r, dns.RcodeFormatError)
		_ = w.WriteMsg(m)
		return
	}
	q := r.Question[0]
	name := strings.TrimSuffix(strings.ToLower(q.Name), ".")
	g.mu.Lock()
	gr, onRefused := g.policy.grant(name), g.onRefused
	g.mu.Unlock()
	if name == "" || !gr.allowed {
		_ = w.WriteMsg(refusal(r))
		if onRefused != nil {
			onRefused(EgressRefusal{Name: name, Type: dns.TypeToString[q.Qtype]})
		}
		return
	}
	resp, err := g.forward(r, w.RemoteAddr().Network() == "tcp")
	if err != nil {
		m := new(dns.Msg)
		m.SetRcode(r, dns.RcodeServerFailure)
		_ = w.WriteMsg(m)
		return
	}
	if addrs, ttl := answerAddrs(resp); len(addrs) > 0 {
		if err := g.record(name, addrs, ttl); err != nil {
			resp = new(dns.Msg)
			resp.SetRcode(r, dns.RcodeServerFailure)
		}
	}
	resp.Id = r.Id
	if w.RemoteAddr().Network() != "tcp" {
		size := dns.MinMsgSize
		if o := r.IsEdns0(); o != nil {
			size = int(o.UDPSize())
		}
		resp.Truncate(size)
	}
	_ = w.WriteMsg(resp)
}

// refusal is the NXDOMAIN answer to r.
func refusal(r *dns.Msg) *dns.Msg {
	m := new(dns.Msg)
	m.SetRcode(r, dns.RcodeNameError)
	m.RecursionAvailable = true
	if o := r.IsEdns0(); o != nil {
		opt := &dns.OPT{Hdr: dns.RR_Header{Name: ".", Rrtype: dns.TypeOPT}}
		opt.SetUDPSize(dns.DefaultMsgSize)
		opt.Option = append(opt.Option, &dns.EDNS0_EDE{InfoCode: dns.ExtendedErrorCodeBlocked, ExtraText: egressRefusalText})
		m.Extra = append(m.Extra, opt)
	}
	return m
}

// forward asks the executor's resolvers in turn, over UDP (TCP after a
// truncated answer, or when the client asked over TCP).
func (g *egressGuard) forward(r *dns.Msg, tcp bool) (*dns.Msg, error) {
	q := r.Copy()
	var err error
	for _, up := range g.e.plan.resolvers {
		addr := netip.AddrPortFrom(up, 53).String()
		var resp *dns.Msg
		if !tcp {
			resp, _, err = (&dns.Client{Net: "udp", Timeout: egressUpstreamTimeout}).Exchange(q, addr)
			if err == nil && !resp.Truncated {
				return resp, nil
			}
		}
		resp, _, err = (&dns.Client{Net: "tcp", Timeout: egressUpstreamTimeout}).Exchange(q, addr)
		if err == nil {
			return resp, nil
		}
	}
	if err == nil {
		err = errNoResolvers
	}
	return nil, err
}

// errNoResolvers is forward's error without upstream resolvers.
var errNoResolvers = errors.New("no upstream resolvers configured")

// answerAddrs are the IPv4 addresses of the answer's A records and the
// smallest TTL among them.
func answerAddrs(m *dns.Msg) ([]netip.Addr, time.Duration) {
	var out []netip.Addr
	var ttl uint32
	for _, rr := range m.Answer {
		a, ok := rr.(*dns.A)
		if !ok {
			continue
		}
		addr, ok := netip.AddrFromSlice(a.A.To4())
		if !ok {
			continue
		}
		if len(out) == 0 || a.Hdr.Ttl < ttl {
			ttl = a.Hdr.Ttl
		}
		out = append(out, addr)
	}
	return out, time.Duration(ttl) * time.Second
}
