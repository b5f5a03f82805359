package e2e

import (
	"fmt"
	"strings"
	"testing"
	"time"

	eventsv1 "k8s.io/api/events/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/bashtask/bashtask-operator/api/v1alpha1"
	"github.com/bashtask/bashtask-operator/internal/rig/testutil"
)

// A workspace's egress policy through the plugin, the controller and the
// agent processes: the workspace's resolver refuses a name its policy
// does not allow (NXDOMAIN, answered by the agent without asking
// upstream, so nothing leaves the host), the refusal becomes an
// EgressRefused event on the workspace, and a changed spec.egress is
// applied and named by the EgressPolicy condition's generation.
func TestWorkspaceEgressPolicy(t *testing.T) {
	needWorkspaces(t)
	ns := newNamespace(t)
	ws := createWorkspace(t, ns, "eg", "--egress-allow", "only.example")
	waitEgressGeneration(t, ws)
	run := func(cmd string) string {
		t.Helper()
		out, errOut, code := plugin(t.Context(), "", "-n", ns, "run", "--workspace", "eg", "--", cmd)
		if code != 0 {
			t.Fatalf("%s: exit %d: %s %s", cmd, code, out, errOut)
		}
		return out
	}
	lookup := `getent ahostsv4 %s >/dev/null && echo resolved || echo "refused $?"; grep -c '^nameserver' /etc/resolv.conf`
	if out := run(fmt.Sprintf(lookup, "refused.example")); out != "refused 2\n1\n" {
		t.Errorf("a name the policy does not allow: %q, want it refused (getent's 2: not found) with one nameserver, the workspace's", out)
	}
	testutil.WaitFor(t, "an EgressRefused event naming refused.example", time.Minute, func() error {
		var list eventsv1.EventList
		if err := k8s.List(t.Context(), &list, client.InNamespace(ns)); err != nil {
			return err
		}
		var seen []string
		for _, ev := range list.Items {
			if ev.Regarding.Name == "eg" {
				seen = append(seen, ev.Reason+": "+ev.Note)
				if ev.Reason == "EgressRefused" && strings.Contains(ev.Note, "refused.example") {
					return nil
				}
			}
		}
		return fmt.Errorf("events of the workspace: %q", seen)
	})

	if err := k8s.Get(t.Context(), client.ObjectKeyFromObject(ws), ws); err != nil {
		t.Fatal(err)
	}
	patch := client.MergeFrom(ws.DeepCopy())
	ws.Spec.Egress = &v1.EgressPolicy{Default: ptr.To(v1.EgressDefaultAllow), Deny: []v1.EgressRule{{Domain: "*.blocked.example"}}}
	if err := k8s.Patch(t.Context(), ws, patch); err != nil {
		t.Fatal(err)
	}
	waitEgressGeneration(t, ws)
	if out := run(fmt.Sprintf(lookup, "a.blocked.example")); out != "refused 2\n1\n" {
		t.Errorf("a denied name after the change: %q, want it refused", out)
	}
}

// waitEgressGeneration waits until the EgressPolicy condition names ws's
// generation.
func waitEgressGeneration(t *testing.T, ws *v1.BashWorkspace) {
	t.Helper()
	testutil.WaitFor(t, fmt.Sprintf("the EgressPolicy condition of generation %d", ws.Generation), time.Minute, func() error {
		var got v1.BashWorkspace
		if err := k8s.Get(t.Context(), client.ObjectKeyFromObject(ws), &got); err != nil {
			return err
		}
		c := meta.FindStatusCondition(got.Status.Conditions, v1.ConditionEgressPolicy)
		if c == nil || c.Status != "True" || c.ObservedGeneration != got.Generation {
			return fmt.Errorf("generation %d, condition %+v", got.Generation, c)
		}
		return nil
	})
}
