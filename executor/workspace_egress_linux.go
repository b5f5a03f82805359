//go:build linux

package executor

import "fmt"

// SetEgressPolicy makes p the egress policy of a workspace of
// [NetworkEgress] (docs/egress.md); nil allows everything. The first
// policy starts the workspace's resolver (a DNS server on the host end of
// its veth pair) and gives the workspace's later tasks a resolv.conf
// naming it; from then on it stays, forwarding every name when the policy
// allows every name. A change applies before SetEgressPolicy returns:
// new connections follow it, open ones stay open. onRefused, when not
// nil, is called for each name the resolver refuses (from the resolver's
// goroutines). The error wraps ErrInvalidSpec for an invalid policy or a
// workspace of another network, and says what failed in nftables or the
// resolver's sockets otherwise.
func (w *Workspace) SetEgressPolicy(p *EgressPolicy, onRefused func(EgressRefusal)) error {
	var pol EgressPolicy
	if p != nil {
		if err := p.Validate(); err != nil {
			return err
		}
		pol = *p
	}
	w.sys.mu.Lock()
	defer w.sys.mu.Unlock()
	switch {
	case w.sys.closed:
		return fmt.Errorf("%w: workspace %s is closed", ErrInvalidSpec, w.id)
	case w.network != NetworkEgress || w.sys.link == nil:
		if p == nil {
			return nil
		}
		return fmt.Errorf("%w: an egress policy needs network Egress, workspace %s has %s", ErrInvalidSpec, w.id, w.network)
	case w.sys.guard != nil:
		return w.sys.guard.setPolicy(pol, onRefused)
	case p == nil:
		return nil
	}
	g, err := w.sys.link.e.guard(w.sys.link, pol, onRefused)
	if err != nil {
		return err
	}
	w.sys.guard = g
	return nil
}

// resolvConf is the workspace's own resolv.conf once it has an egress
// policy, else "".
func (w *Workspace) resolvConf() string {
	w.sys.mu.Lock()
	defer w.sys.mu.Unlock()
	if w.sys.guard == nil {
		return ""
	}
	return w.sys.guard.resolvPath
}

// trustBundle is the path of the workspace's trust bundle (its CA's
// certificate after the node's roots) once its egress policy had
// injection rules, else "".
func (w *Workspace) trustBundle() string {
	w.sys.mu.Lock()
	g := w.sys.guard
	w.sys.mu.Unlock()
	if g == nil {
		return ""
	}
	return g.trustBundle()
}
