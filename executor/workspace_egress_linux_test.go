//go:build linux

package executor

import (
	"errors"
	"net"
	"net/netip"
	"strconv"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/bashtask/bashtask-operator/internal/rig/upstream"
)

// A workspace of network Egress holds a veth pair and an address slot of
// its own for its life: its tasks reach the test internet through it
// and not the node; a task of another Egress workspace does not reach a
// listener on the first workspace's address; and Remove deletes the pair
// and frees the slot.
func TestWorkspaceEgress(t *testing.T) {
	requireEgressHost(t)
	ti := newTestInternet(t)
	ex := tenantExecutor(t, func(c *Config) { c.Egress = egressTestConfig(ti) })
	if !ex.Capabilities().Egress {
		t.Fatalf("no egress capability: %v", ex.EgressError())
	}
	open := func() *Workspace {
		uid := workspaceUIDs.Add(1)
		w, err := ex.OpenWorkspace(WorkspaceOptions{ID: "ws-egress-" + strconv.Itoa(int(uid)), UID: uid, GID: uid, Network: NetworkEgress})
		if err != nil {
			t.Fatalf("OpenWorkspace: %v", err)
		}
		return w
	}
	w1, w2 := open(), open()
	defer func() {
		if err := w2.Remove(); err != nil {
			t.Errorf("Remove: %v", err)
		}
	}()
	removed := false
	defer func() {
		if !removed {
			_ = w1.Remove()
		}
	}()
	l1, l2 := w1.sys.link, w2.sys.link
	if l1 == nil || l2 == nil || l1.slot == l2.slot {
		t.Fatalf("egress links %+v and %+v, want one slot each", l1, l2)
	}
	if _, err := netlink.LinkByName(l1.name); err != nil {
		t.Fatalf("the host end %s of the first workspace: %v", l1.name, err)
	}

	// A listener in the first workspace's namespace on its egress address,
	// as a dev server a task of it would start on 0.0.0.0.
	w1Addr := netip.AddrPortFrom(l1.task, 9091).String()
	if err := upstream.InNetns(w1.sys.ns, func() error {
		l, err := net.Listen("tcp4", w1Addr)
		if err != nil {
			return err
		}
		serveLine(t, l, "w1")
		return nil
	}); err != nil {
		t.Fatalf("listening in the first workspace's namespace: %v", err)
	}
	// Positive control: the listener answers inside its namespace.
	if err := upstream.InNetns(w1.sys.ns, func() error {
		line, err := dialLine(w1Addr)
		if err == nil && line != "w1" {
			err = errors.New("answer " + line)
		}
		return err
	}); err != nil {
		t.Fatalf("positive control: %s in its own namespace: %v", w1Addr, err)
	}

	internet := netip.AddrPortFrom(ti.addr, internetPort).String()
	targets := map[string]string{"internet": internet, "w1": w1Addr}
	got, _ := runProbesAs(t, ex, wsSpec(t, w1, "", "", false), targets, "")
	if got["internet"] != "reached internet" || got["w1"] != "reached w1" {
		t.Errorf("a task of the first workspace: %v, want the internet and its own listener reached", got)
	}
	got, _ = runProbesAs(t, ex, wsSpec(t, w2, "", "", false), targets, "")
	if got["internet"] != "reached internet" || got["w1"] != "blocked" {
		t.Errorf("a task of the second workspace: %v, want the internet reached and the first workspace's listener blocked", got)
	}

	slot, name := l1.slot, l1.name
	if err := w1.Remove(); err != nil {
		t.Fatalf("Remove: %v", err)
	}
	removed = true
	deadline := time.Now().Add(30 * time.Second)
	for {
		_, err := netlink.LinkByName(name)
		ex.egress.mu.Lock()
		used := ex.egress.used[slot]
		ex.egress.mu.Unlock()
		if err != nil && !used {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after Remove: the host end %s (%v) and slot %d used %v", name, err, slot, used)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
