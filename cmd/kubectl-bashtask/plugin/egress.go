package plugin

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"

	"github.com/spf13/pflag"
	"k8s.io/utils/ptr"

	bashtaskv1alpha1 "github.com/bashtask/bashtask-operator/api/v1alpha1"
)

// egressFlagValues are --egress-allow and --egress-deny, each repeatable.
type egressFlagValues struct {
	allow, deny []string
}

// add registers the flags on fl.
func (e *egressFlagValues) add(fl *pflag.FlagSet) {
	fl.StringArrayVar(&e.allow, "egress-allow", nil, "spec.egress.allow: a domain the tasks may reach, example.com or *.example.com, "+
		"optionally with ports as DOMAIN:PORT[,PORT] (repeatable); any --egress-allow makes every other name denied (docs/egress.md). Sets --network Egress")
	fl.StringArrayVar(&e.deny, "egress-deny", nil, "spec.egress.deny: a domain the tasks may not reach, example.com or *.example.com (repeatable); "+
		"without --egress-allow every other name stays allowed (docs/egress.md). Sets --network Egress")
}

// set is true when either flag was given.
func (e egressFlagValues) set() bool { return len(e.allow)+len(e.deny) > 0 }

var egressDomain = regexp.MustCompile(bashtaskv1alpha1.EgressDomainPattern)

// policy is spec.egress from the flags, nil without them; each value is
// checked against the API's rules, the error naming the flag.
func (e egressFlagValues) policy() (*bashtaskv1alpha1.EgressPolicy, error) {
	if !e.set() {
		return nil, nil
	}
	p := &bashtaskv1alpha1.EgressPolicy{Default: ptr.To(bashtaskv1alpha1.EgressDefaultAllow)}
	if len(e.allow) > 0 {
		p.Default = ptr.To(bashtaskv1alpha1.EgressDefaultDeny)
	}
	for _, l := range []struct {
		flag  string
		vals  []string
		rules *[]bashtaskv1alpha1.EgressRule
	}{{"--egress-allow", e.allow, &p.Allow}, {"--egress-deny", e.deny, &p.Deny}} {
		if len(l.vals) > bashtaskv1alpha1.MaxEgressRules {
			return nil, fmt.Errorf("%s: %d domains, at most %d", l.flag, len(l.vals), bashtaskv1alpha1.MaxEgressRules)
		}
		for _, v := range l.vals {
			r, err := egressRule(l.flag, v)
			if err != nil {
				return nil, err
			}
			*l.rules = append(*l.rules, r)
		}
	}
	return p, nil
}

// egressRule parses DOMAIN[:PORT[,PORT]] of flag (ports on
// --egress-allow only).
func egressRule(flag, v string) (bashtaskv1alpha1.EgressRule, error) {
	domain, ports, hasPorts := strings.Cut(v, ":")
	r := bashtaskv1alpha1.EgressRule{Domain: domain}
	if len(domain) > bashtaskv1alpha1.MaxEgressDomainLength || !egressDomain.MatchString(domain) {
		return r, fmt.Errorf("%s %q: the domain must be a lower-case DNS name such as example.com, or *. followed by one such as *.example.com", flag, v)
	}
	if !hasPorts {
		return r, nil
	}
	if flag != "--egress-allow" {
		return r, fmt.Errorf("%s %q: a denied domain is denied on every port; ports narrow --egress-allow only", flag, v)
	}
	for _, s := range strings.Split(ports, ",") {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 || n > 65535 {
			return r, fmt.Errorf("%s %q: port %q is not a number from 1 to 65535", flag, v, s)
		}
		r.Ports = append(r.Ports, int32(n))
	}
	if len(r.Ports) > bashtaskv1alpha1.MaxEgressPorts {
		return r, fmt.Errorf("%s %q: %d ports, at most %d", flag, v, len(r.Ports), bashtaskv1alpha1.MaxEgressPorts)
	}
	return r, nil
}

// taskEgress sets spec.egress and network Egress of a task without a
// workspace from --egress-allow and --egress-deny; with --workspace they
// are refused, the workspace's spec.egress being the one that applies.
func taskEgress(bt *bashtaskv1alpha1.BashTask, f runFlags) error {
	if !f.egress.set() {
		return nil
	}
	if f.workspace != "" {
		return fmt.Errorf("--egress-allow and --egress-deny with --workspace: the tasks of workspace %s follow its spec.egress; "+
			"change it with kubectl patch bashworkspace %s --type merge -p '{\"spec\":{\"egress\":...}}' (docs/egress.md)", f.workspace, f.workspace)
	}
	p, err := f.egress.policy()
	if err != nil {
		return err
	}
	bt.Spec.Egress, bt.Spec.Network = p, ptr.To(bashtaskv1alpha1.NetworkEgress)
	return nil
}
