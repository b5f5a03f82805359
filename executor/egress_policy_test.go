package executor

import (
	"errors"
	"slices"
	"testing"
)

// A deny rule wins; under DefaultDeny the matching allow rules' ports are
// merged, and a rule without ports grants every port; a wildcard matches
// subdomains at any depth but not the name itself.
func TestEgressPolicyGrant(t *testing.T) {
	p := &EgressPolicy{DefaultDeny: true,
		Allow: []EgressRule{{Domain: "*.example.com", Ports: []uint16{443}}, {Domain: "api.example.com", Ports: []uint16{80, 443}}, {Domain: "pypi.org"}},
		Deny:  []EgressRule{{Domain: "bad.example.com"}},
	}
	for _, tc := range []struct {
		name  string
		want  bool
		any   bool
		ports []uint16
	}{
		{"pypi.org", true, true, nil},
		{"files.pypi.org", false, false, nil},
		{"example.com", false, false, nil},
		{"a.b.example.com", true, false, []uint16{443}},
		{"api.example.com", true, false, []uint16{443, 80}},
		{"bad.example.com", false, false, nil},
		{"xexample.com", false, false, nil},
	} {
		g := p.grant(tc.name)
		if g.allowed != tc.want || g.any != tc.any || !slices.Equal(g.ports, tc.ports) {
			t.Errorf("grant(%s) = %+v, want allowed %v any %v ports %v", tc.name, g, tc.want, tc.any, tc.ports)
		}
	}
	allow := &EgressPolicy{Deny: []EgressRule{{Domain: "*.ads.example"}}}
	if g := allow.grant("x.ads.example"); g.allowed {
		t.Errorf("default Allow granted a denied name: %+v", g)
	}
	if g := allow.grant("other.example"); !g.allowed || !g.any {
		t.Errorf("default Allow: %+v for a name no rule matches", g)
	}
	if err := (&EgressPolicy{Allow: []EgressRule{{Domain: "ok.example"}, {Domain: "-bad.example"}}}).Validate(); !errors.Is(err, ErrInvalidSpec) || err.Error() == "" {
		t.Errorf("Validate of a bad domain: %v", err)
	}
}
