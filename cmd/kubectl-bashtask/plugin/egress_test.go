package plugin

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"k8s.io/utils/ptr"

	bashtaskv1alpha1 "github.com/bashtask/bashtask-operator/api/v1alpha1"
)

// --egress-allow makes the default Deny, --egress-deny alone leaves it
// Allow; both set network Egress; bad values name the flag.
func TestEgressFlags(t *testing.T) {
	allowOnly := egressFlagValues{allow: []string{"pypi.org", "*.github.com:22,443"}}
	got, err := workspaceSpec(workspaceCreateFlags{egress: allowOnly, snapshotAfterTask: -1})
	if err != nil {
		t.Fatal(err)
	}
	want := &bashtaskv1alpha1.EgressPolicy{Default: ptr.To(bashtaskv1alpha1.EgressDefaultDeny),
		Allow: []bashtaskv1alpha1.EgressRule{{Domain: "pypi.org"}, {Domain: "*.github.com", Ports: []int32{22, 443}}}}
	if diff := cmp.Diff(want, got.Egress); diff != "" || ptr.Deref(got.Network, "") != bashtaskv1alpha1.NetworkEgress {
		t.Errorf("workspace create --egress-allow: network %v, egress (-want +got):\n%s", got.Network, diff)
	}

	bt, err := buildTask("ns", runFlags{egress: egressFlagValues{deny: []string{"evil.example"}}}, false, []string{"true"}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	want = &bashtaskv1alpha1.EgressPolicy{Default: ptr.To(bashtaskv1alpha1.EgressDefaultAllow), Deny: []bashtaskv1alpha1.EgressRule{{Domain: "evil.example"}}}
	if diff := cmp.Diff(want, bt.Spec.Egress); diff != "" || ptr.Deref(bt.Spec.Network, "") != bashtaskv1alpha1.NetworkEgress {
		t.Errorf("run --egress-deny: network %v, egress (-want +got):\n%s", bt.Spec.Network, diff)
	}

	for _, tc := range []struct {
		f    runFlags
		want string
	}{
		{runFlags{egress: egressFlagValues{allow: []string{"PyPI.org"}}}, `--egress-allow "PyPI.org": the domain must be`},
		{runFlags{egress: egressFlagValues{allow: []string{"a.example:0"}}}, `--egress-allow "a.example:0": port "0"`},
		{runFlags{egress: egressFlagValues{deny: []string{"a.example:80"}}}, "ports narrow --egress-allow only"},
		{runFlags{workspace: "s1", egress: egressFlagValues{allow: []string{"a.example"}}}, "follow its spec.egress"},
	} {
		if _, err := buildTask("ns", tc.f, false, []string{"true"}, nil, nil); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: %v, want an error with %q", tc.f.egress, err, tc.want)
		}
	}
	if _, err := workspaceSpec(workspaceCreateFlags{network: "None", egress: allowOnly, snapshotAfterTask: -1}); err == nil || !strings.Contains(err.Error(), "need --network Egress") {
		t.Errorf("--network None with --egress-allow: %v", err)
	}
}
