package api_test

import (
	"fmt"
	"strings"
	"testing"

	"k8s.io/utils/ptr"

	v1 "github.com/bashtask/bashtask-operator/api/v1alpha1"
)

// egressOn gives a workspace network Egress and the policy p.
func egressOn(p v1.EgressPolicy) func(*v1.BashWorkspace) {
	return func(ws *v1.BashWorkspace) {
		ws.Spec.Network = ptr.To(v1.NetworkEgress)
		ws.Spec.Egress = &p
	}
}

// spec.egress: domain patterns are checked by CEL with a message naming
// the field; deny rules name no ports; the policy needs network Egress.
func TestEgressPolicyValidation(t *testing.T) {
	ns := newNamespace(t)
	allow := func(domains ...string) v1.EgressPolicy {
		var p v1.EgressPolicy
		for _, d := range domains {
			p.Allow = append(p.Allow, v1.EgressRule{Domain: d})
		}
		return p
	}
	tests := map[string]struct {
		mutate  func(*v1.BashWorkspace)
		wantErr string
	}{
		"exact and wildcard": {mutate: egressOn(allow("pypi.org", "*.pythonhosted.org", "localhost", "a-b.c0.example"))},
		"deny with default":  {mutate: egressOn(v1.EgressPolicy{Default: ptr.To(v1.EgressDefaultAllow), Deny: []v1.EgressRule{{Domain: "*.example.com"}}})},
		"ports":              {mutate: egressOn(v1.EgressPolicy{Allow: []v1.EgressRule{{Domain: "github.com", Ports: []int32{22, 443}}}})},
		"upper case":         {mutate: egressOn(allow("PyPI.org")), wantErr: "spec.egress.allow[0].domain: Invalid value"},
		"bare wildcard":      {mutate: egressOn(allow("*")), wantErr: "domain must be a lower-case DNS name"},
		"inner wildcard":     {mutate: egressOn(allow("a.*.example.com")), wantErr: "spec.egress.allow[0].domain"},
		"trailing dot":       {mutate: egressOn(allow("example.com.")), wantErr: "spec.egress.allow[0].domain"},
		"hyphen at the end":  {mutate: egressOn(allow("example-.com")), wantErr: "spec.egress.allow[0].domain"},
		"empty label":        {mutate: egressOn(allow("a..com")), wantErr: "spec.egress.allow[0].domain"},
		"url":                {mutate: egressOn(allow("https://example.com/")), wantErr: "spec.egress.allow[0].domain"},
		"label too long":     {mutate: egressOn(allow(strings.Repeat("a", 64) + ".com")), wantErr: "spec.egress.allow[0].domain"},
		"second rule bad":    {mutate: egressOn(allow("ok.example", "bad_name.example")), wantErr: "spec.egress.allow[1].domain"},
		"bad deny":           {mutate: egressOn(v1.EgressPolicy{Deny: []v1.EgressRule{{Domain: "*example.com"}}}), wantErr: "spec.egress.deny[0].domain"},
		"port zero":          {mutate: egressOn(v1.EgressPolicy{Allow: []v1.EgressRule{{Domain: "a.example", Ports: []int32{0}}}}), wantErr: "spec.egress.allow[0].ports[0]"},
		"port too large":     {mutate: egressOn(v1.EgressPolicy{Allow: []v1.EgressRule{{Domain: "a.example", Ports: []int32{65536}}}}), wantErr: "spec.egress.allow[0].ports[0]"},
		"deny with ports":    {mutate: egressOn(v1.EgressPolicy{Deny: []v1.EgressRule{{Domain: "a.example", Ports: []int32{80}}}}), wantErr: "spec.egress.deny[].ports must be unset"},
		"unknown default":    {mutate: egressOn(v1.EgressPolicy{Default: ptr.To(v1.EgressDefault("Block"))}), wantErr: "spec.egress.default"},
		"too many rules":     {mutate: egressOn(allow(manyDomains(v1.MaxEgressRules + 1)...)), wantErr: "spec.egress.allow"},
		"network None": {mutate: func(ws *v1.BashWorkspace) {
			egressOn(allow("pypi.org"))(ws)
			ws.Spec.Network = ptr.To(v1.NetworkNone)
		}, wantErr: "spec.egress needs spec.network Egress"},
		"network unset": {mutate: func(ws *v1.BashWorkspace) {
			egressOn(allow("pypi.org"))(ws)
			ws.Spec.Network = nil
		}, wantErr: "spec.egress needs spec.network Egress"},
	}
	i := 0
	for name, tc := range tests {
		i++
		t.Run(name, func(t *testing.T) {
			err := env.Client.Create(t.Context(), workspace(ns, fmt.Sprintf("e%d", i), tc.mutate))
			if tc.wantErr == "" {
				if err != nil {
					t.Fatalf("valid workspace rejected: %v", err)
				}
				return
			}
			wantInvalid(t, err, tc.wantErr)
		})
	}
}

func manyDomains(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("d%d.example", i)
	}
	return out
}

// A workspace's spec.egress may be added, changed and removed; a task's
// needs network Egress, no workspace, and is immutable.
func TestEgressPolicyUpdateAndTask(t *testing.T) {
	ns := newNamespace(t)
	ws := workspace(ns, "live", func(ws *v1.BashWorkspace) { ws.Spec.Network = ptr.To(v1.NetworkEgress) })
	if err := env.Client.Create(t.Context(), ws); err != nil {
		t.Fatal(err)
	}
	for i, p := range []*v1.EgressPolicy{
		{Allow: []v1.EgressRule{{Domain: "pypi.org"}}},
		{Allow: []v1.EgressRule{{Domain: "*.github.com", Ports: []int32{443}}}},
		nil,
	} {
		ws.Spec.Egress = p
		if err := env.Client.Update(t.Context(), ws); err != nil {
			t.Fatalf("update %d of a workspace's spec.egress refused: %v", i, err)
		}
	}

	policy := &v1.EgressPolicy{Allow: []v1.EgressRule{{Domain: "pypi.org"}}}
	bad := map[string]func(*v1.BashTask){
		"no network":   func(bt *v1.BashTask) { bt.Spec.Egress = policy },
		"network None": func(bt *v1.BashTask) { bt.Spec.Egress, bt.Spec.Network = policy, ptr.To(v1.NetworkNone) },
		"workspace":    func(bt *v1.BashTask) { bt.Spec.Egress, bt.Spec.Workspace = policy, ptr.To("live") },
	}
	for name, m := range bad {
		t.Run(name, func(t *testing.T) {
			wantInvalid(t, env.Client.Create(t.Context(), task(ns, "t-"+strings.ReplaceAll(strings.ToLower(name), " ", "-"), m)), "spec.egress needs spec.network Egress and no spec.workspace")
		})
	}
	bt := task(ns, "t-ok", func(bt *v1.BashTask) { bt.Spec.Egress, bt.Spec.Network = policy, ptr.To(v1.NetworkEgress) })
	if err := env.Client.Create(t.Context(), bt); err != nil {
		t.Fatalf("a task with network Egress and spec.egress refused: %v", err)
	}
	bt.Spec.Egress = &v1.EgressPolicy{Allow: []v1.EgressRule{{Domain: "github.com"}}}
	wantInvalid(t, env.Client.Update(t.Context(), bt), "spec.egress of a BashTask is immutable")
}

// spec.egress.inject: the header is a token, the domain a DNS name the
// policy lets be reached on port 443 (not denied, allowed under a
// default of Deny), the workspace's network Egress (a rule on network
// Node is refused), and a task gets none.
func TestEgressInjectionValidation(t *testing.T) {
	ns := newNamespace(t)
	inj := func(domain, header string) v1.EgressInjection {
		return v1.EgressInjection{Domain: domain, Header: header, ValuePrefix: ptr.To("Bearer "), SecretKeyRef: v1.KeySelector{Name: "gh", Key: "token"}}
	}
	pol := func(p v1.EgressPolicy, rules ...v1.EgressInjection) func(*v1.BashWorkspace) {
		p.Inject = rules
		return egressOn(p)
	}
	allowAPI := v1.EgressPolicy{Allow: []v1.EgressRule{{Domain: "*.github.com", Ports: []int32{443}}}}
	tests := map[string]struct {
		mutate  func(*v1.BashWorkspace)
		wantErr string
	}{
		"allowed":          {mutate: pol(allowAPI, inj("api.github.com", "Authorization"))},
		"default allow":    {mutate: pol(v1.EgressPolicy{}, inj("pypi.org", "X-Api-Key"))},
		"ca bundle":        {mutate: pol(allowAPI, v1.EgressInjection{Domain: "api.github.com", Header: "Authorization", SecretKeyRef: v1.KeySelector{Name: "gh", Key: "token"}, CABundle: &v1.ValueSource{ConfigMapKeyRef: &v1.KeySelector{Name: "ca", Key: "ca.crt"}}})},
		"header space":     {mutate: pol(allowAPI, inj("api.github.com", "Bad Header")), wantErr: "spec.egress.inject[0].header"},
		"header colon":     {mutate: pol(allowAPI, inj("api.github.com", "Authorization:")), wantErr: "header must be an HTTP header name"},
		"malformed domain": {mutate: pol(allowAPI, inj("API.github.com", "Authorization")), wantErr: "spec.egress.inject[0].domain"},
		"denied domain": {mutate: pol(v1.EgressPolicy{Deny: []v1.EgressRule{{Domain: "*.github.com"}}}, inj("api.github.com", "Authorization")),
			wantErr: "a header cannot be injected for a domain the policy denies"},
		"not allowed":  {mutate: pol(allowAPI, inj("pypi.org", "Authorization")), wantErr: "is not allowed on port 443"},
		"not on 443":   {mutate: pol(v1.EgressPolicy{Allow: []v1.EgressRule{{Domain: "api.github.com", Ports: []int32{80}}}}, inj("api.github.com", "Authorization")), wantErr: "is not allowed on port 443"},
		"no secret":    {mutate: pol(allowAPI, v1.EgressInjection{Domain: "api.github.com", Header: "Authorization"}), wantErr: "spec.egress.inject[0].secretKeyRef"},
		"prefix CR LF": {mutate: pol(allowAPI, v1.EgressInjection{Domain: "api.github.com", Header: "Authorization", ValuePrefix: ptr.To("a\r\nX: y"), SecretKeyRef: v1.KeySelector{Name: "gh", Key: "token"}}), wantErr: "spec.egress.inject[0].valuePrefix"},
		"network Node": {mutate: func(ws *v1.BashWorkspace) {
			pol(allowAPI, inj("api.github.com", "Authorization"))(ws)
			ws.Spec.Network = ptr.To(v1.NetworkNode)
		}, wantErr: "spec.egress needs spec.network Egress"},
	}
	i := 0
	for name, tc := range tests {
		i++
		t.Run(name, func(t *testing.T) {
			err := env.Client.Create(t.Context(), workspace(ns, fmt.Sprintf("i%d", i), tc.mutate))
			if tc.wantErr == "" {
				if err != nil {
					t.Fatalf("valid workspace rejected: %v", err)
				}
				return
			}
			wantInvalid(t, err, tc.wantErr)
		})
	}
	bt := task(ns, "t-inject", func(bt *v1.BashTask) {
		bt.Spec.Network = ptr.To(v1.NetworkEgress)
		bt.Spec.Egress = &v1.EgressPolicy{Inject: []v1.EgressInjection{inj("pypi.org", "Authorization")}}
	})
	wantInvalid(t, env.Client.Create(t.Context(), bt), "spec.egress.inject needs a BashWorkspace")
}
