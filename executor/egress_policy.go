package executor

import (
	"crypto/x509"
	"fmt"
	"regexp"
	"slices"
	"strings"

	"golang.org/x/net/http/httpguts"
)

// EgressPolicy limits the names a workspace of [NetworkEgress] reaches
// (docs/egress.md): the workspace's resolver, a DNS server the executor
// runs on the host end of its veth pair, answers only the names the
// policy allows, and with DefaultDeny a connection goes only to an
// address an allowed name resolved to (on the rule's ports). The zero
// value allows everything.
type EgressPolicy struct {
	// DefaultDeny refuses the names no Allow rule matches, and every
	// address no allowed name resolved to. False allows the names no Deny
	// rule matches, and any address.
	DefaultDeny bool
	// Allow and Deny are the rules; a name a Deny rule matches is refused
	// whatever Allow says. Deny rules have no ports.
	Allow, Deny []EgressRule
	// Inject are the credential injection rules (docs/egress.md): HTTPS
	// to their domains goes through the workspace's intercepting proxy,
	// which adds the header. Workspaces only; at most MaxEgressInjections.
	Inject []EgressInjection
}

// MaxEgressInjections is the most injection rules one policy holds
// (api/v1alpha1 MaxEgressInjections).
const MaxEgressInjections = 16

// EgressInjection attaches a header to the HTTPS requests of a workspace
// to a domain, at the workspace's intercepting proxy: the task never
// holds the value.
type EgressInjection struct {
	// Domain is an exact name or "*." and one, as EgressRule.Domain; the
	// policy must allow it on port 443.
	Domain string
	// Header is the header's name, an HTTP token (RFC 9110 section 5.1).
	Header string
	// Value is the header's value (a Secret key's), without CR, LF or
	// NUL; never logged.
	Value string
	// CABundle is PEM certificates that verify the upstream server
	// instead of the node's roots; empty: the node's roots.
	CABundle []byte
	// ScrubResponses replaces Value in the responses' headers and bodies
	// (identity-encoded) with [EgressScrubbed], for a domain that echoes.
	ScrubResponses bool
}

// EgressScrubbed replaces an injected value in the responses of a rule
// with ScrubResponses.
const EgressScrubbed = "[scrubbed by bashtask]"

// String leaves the value out, so that a printed rule never shows it.
func (r EgressInjection) String() string {
	return fmt.Sprintf("{%s %s: (%d bytes) scrub=%t}", r.Domain, r.Header, len(r.Value), r.ScrubResponses)
}

// injection is the rule of p whose domain matches name (lower case), or
// nil; the first one wins.
func (p *EgressPolicy) injection(name string) *EgressInjection {
	for i := range p.Inject {
		if (EgressRule{Domain: p.Inject[i].Domain}).matches(name) {
			return &p.Inject[i]
		}
	}
	return nil
}

// EgressRule matches a domain name and, in an allow rule, the ports a
// connection to its addresses may use.
type EgressRule struct {
	// Domain is a lower-case DNS name (example.com), or "*." and one for
	// its subdomains at any depth (*.example.com matches a.example.com
	// and a.b.example.com, not example.com).
	Domain string
	// Ports are the TCP and UDP destination ports, 1 to 65535; empty:
	// every port and protocol.
	Ports []uint16
}

// EgressRefusal is a name the workspace's resolver refused.
type EgressRefusal struct {
	// Name is the queried name without the trailing dot, in lower case.
	Name string
	// Type is the query's type, such as A or AAAA.
	Type string
}

// egressDomain is the pattern of EgressRule.Domain, as the API's CEL rule
// (api/v1alpha1 EgressDomainPattern).
var egressDomain = regexp.MustCompile(`^(\*\.)?([a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?\.)*[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$`)

// Validate checks p; the error wraps ErrInvalidSpec and names the rule.
func (p *EgressPolicy) Validate() error {
	bad := func(list string, i int, format string, a ...any) error {
		return fmt.Errorf("%w: egress.%s[%d]: %s", ErrInvalidSpec, list, i, fmt.Sprintf(format, a...))
	}
	for _, l := range []struct {
		name  string
		rules []EgressRule
	}{{"allow", p.Allow}, {"deny", p.Deny}} {
		for i, r := range l.rules {
			if len(r.Domain) > 253 || !egressDomain.MatchString(r.Domain) {
				return bad(l.name, i, "domain %q is not a lower-case DNS name, or *. and one", r.Domain)
			}
			if l.name == "deny" && len(r.Ports) > 0 {
				return bad(l.name, i, "a deny rule names no ports")
			}
			if slices.Contains(r.Ports, 0) {
				return bad(l.name, i, "port 0 is not a port (1 to 65535)")
			}
		}
	}
	if len(p.Inject) > MaxEgressInjections {
		return fmt.Errorf("%w: egress.inject has %d rules, at most %d", ErrInvalidSpec, len(p.Inject), MaxEgressInjections)
	}
	for i, r := range p.Inject {
		if err := p.checkInjection(r); err != nil {
			return bad("inject", i, "%v", err)
		}
	}
	return nil
}

// checkInjection checks one injection rule of p: its domain, header and
// value, its CA bundle, and that p lets the domain be reached on port
// 443 (a wildcard's subdomains are checked with one of them).
func (p *EgressPolicy) checkInjection(r EgressInjection) error {
	switch {
	case len(r.Domain) > 253 || !egressDomain.MatchString(r.Domain):
		return fmt.Errorf("domain %q is not a lower-case DNS name, or *. and one", r.Domain)
	case !httpguts.ValidHeaderFieldName(r.Header):
		return fmt.Errorf("header %q is not an HTTP header name (token characters)", r.Header)
	case r.Value == "" || !httpguts.ValidHeaderFieldValue(r.Value):
		return fmt.Errorf("the value of header %s is empty or holds control characters (CR, LF, NUL)", r.Header)
	}
	if len(r.CABundle) > 0 && !x509.NewCertPool().AppendCertsFromPEM(r.CABundle) {
		return fmt.Errorf("the CA bundle of %s holds no PEM certificate", r.Domain)
	}
	name := r.Domain
	if rest, ok := strings.CutPrefix(name, "*."); ok {
		name = "a." + rest
	}
	if g := p.grant(name); !g.allowed || (!g.any && !slices.Contains(g.ports, 443)) {
		return fmt.Errorf("the policy does not let %s be reached on port 443, so no header can be injected there", r.Domain)
	}
	return nil
}

// matches says whether the rule's domain matches name (lower case, no
// trailing dot).
func (r EgressRule) matches(name string) bool {
	if rest, ok := strings.CutPrefix(r.Domain, "*."); ok {
		return strings.HasSuffix(name, "."+rest)
	}
	return name == r.Domain
}

// egressGrant is what a policy lets a name's addresses be reached on.
type egressGrant struct {
	allowed bool
	any     bool     // every port and protocol
	ports   []uint16 // else these TCP and UDP ports
}

// grant is what p lets name (lower case, no trailing dot) reach: nothing
// when a deny rule matches; with DefaultDeny the union of the matching
// allow rules' ports; else everything.
func (p *EgressPolicy) grant(name string) egressGrant {
	for _, r := range p.Deny {
		if r.matches(name) {
			return egressGrant{}
		}
	}
	if !p.DefaultDeny {
		return egressGrant{allowed: true, any: true}
	}
	var g egressGrant
	for _, r := range p.Allow {
		if !r.matches(name) {
			continue
		}
		g.allowed = true
		if len(r.Ports) == 0 {
			return egressGrant{allowed: true, any: true}
		}
		for _, port := range r.Ports {
			if !slices.Contains(g.ports, port) {
				g.ports = append(g.ports, port)
			}
		}
	}
	return g
}
