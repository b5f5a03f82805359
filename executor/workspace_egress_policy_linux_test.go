//go:build linux

package executor

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/bashtask/bashtask-operator/internal/rig/upstream"
)

// A workspace's egress policy, served by the test internet's resolver
// (names under probe.test. resolve to its address): names are allowed and
// refused exactly and by wildcard, a direct IP that no allowed name
// resolved to is dropped, a port outside an allow rule's is dropped, a
// policy change applies to the next connections, and a default Allow
// refuses only the denied names.
func TestWorkspaceEgressPolicy(t *testing.T) {
	requireEgressHost(t)
	ti := newTestInternet(t)
	ex := tenantExecutor(t, func(c *Config) { c.Egress = egressTestConfig(ti) })
	if !ex.Capabilities().Egress {
		t.Fatalf("no egress capability: %v", ex.EgressError())
	}
	w := testWorkspace(t, ex, NetworkEgress, false)
	ip := netip.AddrPortFrom(ti.addr, internetPort).String()
	probe := func(what string, targets map[string]string, want map[string]string) {
		t.Helper()
		got, rest := runProbesAs(t, ex, wsSpec(t, w, "", "", false), targets, "")
		for name, outcome := range want {
			if got[name] != outcome {
				t.Errorf("%s: %s %q, want %q (all: %v, rest: %q)", what, name, got[name], outcome, got, rest)
			}
		}
	}
	var mu sync.Mutex
	var refused []string
	onRefused := func(r EgressRefusal) {
		mu.Lock()
		refused = append(refused, r.Name)
		mu.Unlock()
	}
	set := func(p *EgressPolicy) {
		t.Helper()
		if err := w.SetEgressPolicy(p, onRefused); err != nil {
			t.Fatalf("SetEgressPolicy(%+v): %v", p, err)
		}
	}

	// Positive control: without a policy the address is reached.
	probe("no policy", map[string]string{"ip": ip}, map[string]string{"ip": "reached internet"})

	set(&EgressPolicy{DefaultDeny: true, Allow: []EgressRule{{Domain: "ok.probe.test"}, {Domain: "*.wild.probe.test"}}})
	probe("deny by default, nothing resolved", map[string]string{"ip": ip}, map[string]string{"ip": "blocked"})
	probe("deny by default", map[string]string{"ok": "ok.probe.test:8080", "wild": "a.b.wild.probe.test:8080", "no": "no.probe.test:8080", "base": "wild.probe.test:8080"},
		map[string]string{"ok": "reached internet", "wild": "reached internet", "no": "blocked", "base": "blocked"})
	mu.Lock()
	if !slices.Contains(refused, "no.probe.test") || !slices.Contains(refused, "wild.probe.test") || slices.Contains(refused, "ok.probe.test") {
		t.Errorf("refusals reported: %q, want no.probe.test and wild.probe.test, not ok.probe.test", refused)
	}
	mu.Unlock()

	// A change: the name is still allowed, on another port only; the
	// wildcard is gone, so the address it resolved to is no more.
	set(&EgressPolicy{DefaultDeny: true, Allow: []EgressRule{{Domain: "ok.probe.test", Ports: []uint16{9}}}})
	probe("port 9 only", map[string]string{"ok": "ok.probe.test:8080", "ip": ip}, map[string]string{"ok": "blocked", "ip": "blocked"})
	set(&EgressPolicy{DefaultDeny: true, Allow: []EgressRule{{Domain: "ok.probe.test", Ports: []uint16{9, internetPort}}}})
	probe("port 8080 too", map[string]string{"ok": "ok.probe.test:8080"}, map[string]string{"ok": "reached internet"})

	set(&EgressPolicy{Deny: []EgressRule{{Domain: "no.probe.test"}}})
	probe("allow by default", map[string]string{"ok": "ok.probe.test:8080", "no": "no.probe.test:8080", "ip": ip},
		map[string]string{"ok": "reached internet", "no": "blocked", "ip": "reached internet"})
}

// A policy on a workspace of network None, or an invalid one, is refused
// naming the rule.
func TestWorkspaceEgressPolicyRefused(t *testing.T) {
	ex := tenantExecutor(t)
	w := testWorkspace(t, ex, NetworkNone, false)
	if err := w.SetEgressPolicy(&EgressPolicy{DefaultDeny: true}, nil); err == nil {
		t.Error("a policy on a workspace of network None was accepted")
	}
	for _, p := range []EgressPolicy{
		{Allow: []EgressRule{{Domain: "Example.com"}}},
		{Allow: []EgressRule{{Domain: "a.*.example.com"}}},
		{Deny: []EgressRule{{Domain: "example.com", Ports: []uint16{80}}}},
		{Allow: []EgressRule{{Domain: "example.com", Ports: []uint16{0}}}},
	} {
		if err := p.Validate(); err == nil {
			t.Errorf("policy %+v accepted", p)
		}
	}
}

// A task of network Egress without a workspace follows its Spec.Egress:
// the allowed name is reached, the refused one and the bare address are
// not; the task's resolver is gone with the task.
func TestTaskEgressPolicy(t *testing.T) {
	requireEgressHost(t)
	ti := newTestInternet(t)
	ex := tenantExecutor(t, func(c *Config) { c.Egress = egressTestConfig(ti) })
	var refused []string
	var mu sync.Mutex
	newSpec := func() Spec {
		spec := testSpec(t, "")
		spec.Network = NetworkEgress
		spec.Egress = &EgressPolicy{DefaultDeny: true, Allow: []EgressRule{{Domain: "ok.probe.test"}}}
		spec.EgressRefused = func(r EgressRefusal) { mu.Lock(); refused = append(refused, r.Name); mu.Unlock() }
		return spec
	}
	ip := netip.AddrPortFrom(ti.addr, internetPort).String()
	got, rest := runProbesAs(t, ex, newSpec(), map[string]string{"ip": ip}, "")
	if got["ip"] != "blocked" {
		t.Errorf("the bare address before any lookup: %q (%q), want blocked", got["ip"], rest)
	}
	got, rest = runProbesAs(t, ex, newSpec(), map[string]string{"ok": "ok.probe.test:8080", "no": "no.probe.test:8080"}, "")
	if got["ok"] != "reached internet" || got["no"] != "blocked" {
		t.Errorf("names: %v (%q), want ok reached and no blocked", got, rest)
	}
	mu.Lock()
	defer mu.Unlock()
	if !slices.Contains(refused, "no.probe.test") {
		t.Errorf("refusals %q, want no.probe.test", refused)
	}
	spec := newSpec()
	spec.Workspace = &WorkspaceTask{}
	if _, err := ex.Start(spec); !errors.Is(err, ErrInvalidSpec) {
		t.Errorf("Start with Egress and a workspace: %v, want ErrInvalidSpec", err)
	}
}

// A connection open when the policy changes stays open, while a new one
// to the address its name resolved to is dropped.
func TestWorkspaceEgressPolicyKeepsOpenConnections(t *testing.T) {
	requireEgressHost(t)
	ti := newTestInternet(t)
	ex := tenantExecutor(t, func(c *Config) { c.Egress = egressTestConfig(ti) })
	w := testWorkspace(t, ex, NetworkEgress, false)
	if err := w.SetEgressPolicy(&EgressPolicy{DefaultDeny: true, Allow: []EgressRule{{Domain: "ok.probe.test"}}}, nil); err != nil {
		t.Fatal(err)
	}
	// A server that says a line, waits until the test changed the
	// policy, says go, waits for the task's line and answers it: the
	// task's packets after the change cross the policy's chain.
	accepted, changed := make(chan struct{}), make(chan struct{})
	if err := upstream.InNetns(ti.ns, func() error {
		l, err := net.Listen("tcp4", netip.AddrPortFrom(ti.addr, 8081).String())
		if err != nil {
			return err
		}
		t.Cleanup(func() { l.Close() })
		go func() {
			c, err := l.Accept()
			if err != nil {
				return
			}
			defer c.Close()
			fmt.Fprintln(c, "before")
			close(accepted)
			<-changed
			fmt.Fprintln(c, "go")
			_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
			if line, err := bufio.NewReader(c).ReadString('\n'); err == nil {
				fmt.Fprintln(c, "after "+strings.TrimSpace(line))
			}
		}()
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	task, err := ex.Start(wsSpec(t, w, `exec 3<>/dev/tcp/ok.probe.test/8081 && read -t 5 a <&3 && read -t 5 g <&3 && echo ping >&3 && read -t 5 b <&3; echo "$a $b"
if timeout 3 bash -c 'exec 3<>/dev/tcp/`+ti.addr.String()+`/8080'; then echo new reached; else echo new blocked; fi`, "", false))
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-accepted:
	case <-time.After(10 * time.Second):
		t.Fatal("the task did not connect")
	}
	if err := w.SetEgressPolicy(&EgressPolicy{DefaultDeny: true, Allow: []EgressRule{{Domain: "other.probe.test"}}}, nil); err != nil {
		t.Fatal(err)
	}
	close(changed)
	res := wait(t, task)
	if got := res.Stdout.Tail; got != "before after ping\nnew blocked\n" {
		t.Errorf("stdout %q (stderr %q), want the open connection's two lines and the new one blocked", got, res.Stderr.Tail)
	}
}
