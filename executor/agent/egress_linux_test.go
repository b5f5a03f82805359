//go:build linux

package agent

import (
	"fmt"
	"net"
	"os"
	"strings"
	"testing"

	"github.com/miekg/dns"
	"github.com/vishvananda/netlink"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	agentv1 "github.com/bashtask/bashtask-operator/api/agent/v1"
	"github.com/bashtask/bashtask-operator/executor"
)

// egressZoneAddr is what the test resolver answers for every name under
// zone.test.
const egressZoneAddr = "198.51.100.7"

// testResolver serves the zone zone.test. (A records of egressZoneAddr)
// on an address of TEST-NET-3 of the test's own, added to lo (not a
// loopback address, so the agent takes it as a resolver), and returns
// that address.
func testResolver(t *testing.T) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("the test resolver's link needs root")
	}
	pid := os.Getpid()
	addr := fmt.Sprintf("203.0.113.%d", pid%254+1)
	link, err := netlink.LinkByName("lo")
	if err != nil {
		t.Fatal(err)
	}
	ip, err := netlink.ParseAddr(addr + "/32")
	if err != nil {
		t.Fatal(err)
	}
	if err := netlink.AddrAdd(link, ip); err != nil {
		t.Fatalf("the test resolver's address on lo: %v", err)
	}
	t.Cleanup(func() { _ = netlink.AddrDel(link, ip) })
	pc, err := net.ListenPacket("udp4", addr+":53")
	if err != nil {
		t.Fatal(err)
	}
	srv := &dns.Server{PacketConn: pc, Handler: dns.HandlerFunc(func(w dns.ResponseWriter, r *dns.Msg) {
		m := new(dns.Msg)
		m.SetReply(r)
		if q := r.Question[0]; q.Qtype == dns.TypeA && strings.HasSuffix(q.Name, ".zone.test.") {
			m.Answer = append(m.Answer, &dns.A{Hdr: dns.RR_Header{Name: q.Name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 1}, A: net.ParseIP(egressZoneAddr)})
		}
		_ = w.WriteMsg(m)
	})}
	go func() { _ = srv.ActivateAndServe() }()
	t.Cleanup(func() { _ = srv.Shutdown() })
	return addr
}

// A workspace's egress policy through the Workspaces service: its tasks'
// resolver answers the allowed names (exact and wildcard) from the test
// zone and refuses the others, the refusals are in the workspace's
// status, a new policy in EnsureWorkspace applies to the next lookups,
// and a policy for another network or with a bad rule is refused naming
// the field. A task without a workspace follows its TaskSpec's policy.
func TestWorkspaceEgressPolicyService(t *testing.T) {
	resolver := testResolver(t)
	pid := os.Getpid()
	r := newRig(t, tenantLevel(2101200, 2101201), func(c *Config) {
		c.Executor.Egress = &executor.EgressConfig{ID: fmt.Sprintf("e%x", pid%(1<<24)),
			CIDR: fmt.Sprintf("100.%d.%d.0/24", 96+(pid>>8)%32, pid%256), Resolvers: []string{resolver}}
	})
	if !r.srv.ex.Capabilities().Egress {
		t.Skipf("no network Egress on this host: %v", r.srv.ex.EgressError())
	}
	wc := r.workspaceClient()
	ensureWith := func(uid, network string, p *agentv1.EgressPolicy) error {
		_, err := wc.EnsureWorkspace(t.Context(), &agentv1.EnsureWorkspaceRequest{Spec: &agentv1.WorkspaceSpec{
			Ref: &agentv1.WorkspaceRef{Namespace: "ns", Name: "ws-" + uid, Uid: uid}, Network: network, Egress: p,
		}})
		return err
	}
	allow := func(domains ...string) *agentv1.EgressPolicy {
		p := &agentv1.EgressPolicy{DefaultDeny: true}
		for _, d := range domains {
			p.Allow = append(p.Allow, &agentv1.EgressRule{Domain: d})
		}
		return p
	}
	for name, tc := range map[string]struct {
		network string
		policy  *agentv1.EgressPolicy
		want    string
	}{
		"network None": {"None", allow("ok.zone.test"), "spec.egress needs network Egress"},
		"bad domain":   {"Egress", allow("ok.zone.test", "Bad.zone.test"), "egress.allow[1]"},
		"bad port":     {"Egress", &agentv1.EgressPolicy{Allow: []*agentv1.EgressRule{{Domain: "a.test", Ports: []uint32{70000}}}}, "spec.egress.allow[0].ports[0] 70000"},
	} {
		err := ensureWith("bad-"+strings.ReplaceAll(name, " ", "-"), tc.network, tc.policy)
		if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want InvalidArgument naming %q", name, err, tc.want)
		}
	}

	if err := ensureWith("we", "Egress", allow("ok.zone.test", "*.wild.zone.test")); err != nil {
		t.Fatal(err)
	}
	lookups := `for n in ok.zone.test a.wild.zone.test no.zone.test; do if a=$(getent ahostsv4 $n); then echo "$n ${a%% *}"; else echo "$n refused"; fi; done`
	res := r.runTask(wsTask("e1", "we", lookups))
	if want := "ok.zone.test " + egressZoneAddr + "\na.wild.zone.test " + egressZoneAddr + "\nno.zone.test refused\n"; res.GetStdout().GetTail() != want {
		t.Errorf("lookups: %q (%s %q), want %q", res.GetStdout().GetTail(), res.GetReason(), res.GetStderr().GetTail(), want)
	}
	g, err := wc.GetWorkspace(t.Context(), &agentv1.GetWorkspaceRequest{Uid: "we"})
	if err != nil {
		t.Fatal(err)
	}
	if rs := g.GetStatus().GetEgressRefusals(); len(rs) == 0 || rs[len(rs)-1].GetName() != "no.zone.test" || rs[len(rs)-1].GetCount() < 1 {
		t.Errorf("refusals in the status: %v, want no.zone.test last", rs)
	}

	if err := ensureWith("we", "Egress", allow("no.zone.test")); err != nil {
		t.Fatal(err)
	}
	res = r.runTask(wsTask("e2", "we", lookups))
	if want := "ok.zone.test refused\na.wild.zone.test refused\nno.zone.test " + egressZoneAddr + "\n"; res.GetStdout().GetTail() != want {
		t.Errorf("lookups after the change: %q, want %q", res.GetStdout().GetTail(), want)
	}
	if _, err := wc.DeleteWorkspace(t.Context(), &agentv1.DeleteWorkspaceRequest{Uid: "we"}); err != nil {
		t.Fatal(err)
	}
	// A task without a workspace, with a policy of its own.
	spec := taskSpec("e3", lookups)
	spec.Network, spec.Egress = "Egress", allow("*.wild.zone.test")
	res = r.runTask(spec)
	if want := "ok.zone.test refused\na.wild.zone.test " + egressZoneAddr + "\nno.zone.test refused\n"; res.GetStdout().GetTail() != want {
		t.Errorf("lookups of a task with spec.egress: %q (%s %q), want %q", res.GetStdout().GetTail(), res.GetReason(), res.GetMessage(), want)
	}
}
