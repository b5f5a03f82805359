//go:build linux

package upstream

import (
	"bufio"
	"fmt"
	"net"
	"net/netip"
	"os"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/bashtask/bashtask-operator/internal/rig/testutil"
)

// TestUpstream: a server in the upstream's namespace is reached from the
// caller's at Addr, its resolver answers the names under its domain with
// Addr and others with NXDOMAIN, and Close removes the namespace's file
// and the host's link.
func TestUpstream(t *testing.T) {
	if os.Geteuid() != 0 {
		testutil.SkipUnlessStrict(t, "an upstream needs root (network namespaces, veth pairs)")
	}
	pid := os.Getpid()
	u, err := Start(Config{Name: fmt.Sprintf("bt-upstream-test-%d", pid), Link: fmt.Sprintf("vut%d", pid%1000000), Slot: (pid + 4096) % Slots, Domains: []string{"demo.test"}})
	if err != nil {
		t.Fatal(err)
	}
	closed := false
	defer func() {
		if !closed {
			u.Close()
		}
	}()
	l, err := u.Listen(8080)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			fmt.Fprintln(c, "upstream")
			c.Close()
		}
	}()
	c, err := net.DialTimeout("tcp4", netip.AddrPortFrom(u.Addr, 8080).String(), 5*time.Second)
	if err != nil {
		t.Fatalf("dialing the upstream's server from the host: %v", err)
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	c.Close()
	if err != nil || line != "upstream\n" {
		t.Fatalf("read %q, %v; want %q", line, err, "upstream\n")
	}

	for name, want := range map[string]int{"api.demo.test.": dns.RcodeSuccess, "demo.test.": dns.RcodeSuccess, "a.b.demo.test.": dns.RcodeSuccess, "notdemo.test.": dns.RcodeNameError, "example.com.": dns.RcodeNameError} {
		m := new(dns.Msg)
		m.SetQuestion(name, dns.TypeA)
		r, err := dns.Exchange(m, netip.AddrPortFrom(u.Addr, 53).String())
		if err != nil {
			t.Fatalf("query %s: %v", name, err)
		}
		if r.Rcode != want {
			t.Errorf("%s: rcode %s, want %s", name, dns.RcodeToString[r.Rcode], dns.RcodeToString[want])
			continue
		}
		if want == dns.RcodeSuccess {
			if len(r.Answer) != 1 || r.Answer[0].(*dns.A).A.String() != u.Addr.String() {
				t.Errorf("%s: answer %v, want %s", name, r.Answer, u.Addr)
			}
		}
	}

	u.Close()
	closed = true
	if _, err := os.Stat("/run/netns/" + u.name); !os.IsNotExist(err) {
		t.Errorf("after Close, /run/netns/%s: %v", u.name, err)
	}
	if _, err := net.InterfaceByName(u.link.Attrs().Name); err == nil {
		t.Errorf("after Close, link %s is still there", u.link.Attrs().Name)
	}
}
