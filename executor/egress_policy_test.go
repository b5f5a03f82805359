package executor

import (
	"errors"
	"fmt"
	"slices"
	"strings"
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

// An injection rule is refused, naming it, for a header name that is not
// a token, a value with a line break, a domain the policy denies or does
// not allow on port 443, and a CA bundle without a certificate.
func TestEgressInjectionValidate(t *testing.T) {
	ok := EgressInjection{Domain: "api.example.com", Header: "Authorization", Value: "Bearer x"}
	base := EgressPolicy{DefaultDeny: true, Allow: []EgressRule{{Domain: "*.example.com", Ports: []uint16{443}}, {Domain: "web.example.org", Ports: []uint16{80}}},
		Deny: []EgressRule{{Domain: "bad.example.com"}}}
	p := base
	p.Inject = []EgressInjection{ok}
	if err := p.Validate(); err != nil {
		t.Fatalf("valid rule refused: %v", err)
	}
	for name, mutate := range map[string]func(*EgressInjection){
		"header":  func(r *EgressInjection) { r.Header = "Bad Header" },
		"value":   func(r *EgressInjection) { r.Value = "a\r\nX-Evil: 1" },
		"empty":   func(r *EgressInjection) { r.Value = "" },
		"denied":  func(r *EgressInjection) { r.Domain = "bad.example.com" },
		"other":   func(r *EgressInjection) { r.Domain = "pypi.org" },
		"port 80": func(r *EgressInjection) { r.Domain = "web.example.org" },
		"domain":  func(r *EgressInjection) { r.Domain = "API.example.com" },
		"bundle":  func(r *EgressInjection) { r.CABundle = []byte("not PEM") },
	} {
		r := ok
		mutate(&r)
		p := base
		p.Inject = []EgressInjection{ok, r}
		err := p.Validate()
		if !errors.Is(err, ErrInvalidSpec) || !strings.Contains(err.Error(), "egress.inject[1]") {
			t.Errorf("%s: %v, want ErrInvalidSpec naming egress.inject[1]", name, err)
		}
		if strings.Contains(fmt.Sprint(err, r), "a\r\nX-Evil") || strings.Contains(fmt.Sprint(r), "Bearer x") {
			t.Errorf("%s: the value is printed: %v %v", name, err, r)
		}
	}
}
