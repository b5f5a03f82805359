package plugin

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"k8s.io/cli-runtime/pkg/genericiooptions"
	"k8s.io/utils/ptr"
)

func helpOf(t *testing.T, args ...string) string {
	t.Helper()
	var out bytes.Buffer
	code := Main(t.Context(), Options{IOStreams: genericiooptions.IOStreams{In: strings.NewReader(""), Out: &out, ErrOut: &out}}, append(args, "--help"))
	if code != ExitOK {
		t.Fatalf("%s --help: exit %d\n%s", args, code, out.String())
	}
	return out.String()
}

// TestHelpNamesTheTimeoutCapAndTheWaits: the help of the commands that
// make tasks names the controller's timeout cap and its default, run's
// help the difference between --timeout and --wait-timeout, --detach and
// --ttl, and workspace create's --idle-timeout what the default does:
// suspend.
func TestHelpNamesTheTimeoutCapAndTheWaits(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want []string
	}{
		{[]string{"run"}, []string{"--max-timeout-seconds", "600s", "refused with InvalidSpec", "--wait-timeout", "pending time included",
			"Time pending is not counted", "--detach", "--ttl duration", "(default 1h0m0s)", "workspace's owner", "exits 124"}},
		{[]string{"cp"}, []string{"--max-timeout-seconds", "600s", "--ttl"}},
		{[]string{"shell"}, []string{"--max-timeout-seconds", "600s", "--ttl"}},
		{[]string{"workspace", "create"}, []string{"suspend the workspace to a snapshot"}},
	} {
		help := helpOf(t, tc.args...)
		for _, w := range tc.want {
			if !strings.Contains(help, w) {
				t.Errorf("%s --help does not say %q:\n%s", tc.args, w, help)
			}
		}
	}
	if help := helpOf(t, "workspace", "create"); strings.Contains(help, "delete the workspace after this long") {
		t.Errorf("workspace create --help says --idle-timeout deletes, where the default suspends:\n%s", help)
	}
}

// TestRunWaitFlags: the flags of how run waits are checked before the API
// server is contacted (the kubeconfig points nowhere).
func TestRunWaitFlags(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--detach", "--rm"}, "--detach and --rm"},
		{[]string{"--detach", "-i", "--stream"}, "--detach and --stream"},
		{[]string{"--detach", "--wait-timeout", "1m"}, "--detach and --wait-timeout"},
		{[]string{"--wait-timeout", "-1s"}, "--wait-timeout -1s: must not be negative"},
		{[]string{"--ttl", "-1s"}, "--ttl -1s: must not be negative"},
		{[]string{"-t", "-i", "--stream"}, "-t with --stream or --detach"},
		{[]string{"-t", "--detach"}, "-t with --stream or --detach"},
	} {
		var out, errOut bytes.Buffer
		args := append(append([]string{"--kubeconfig", "/nonexistent/kubeconfig", "run"}, tc.args...), "--", "true")
		code := Main(t.Context(), Options{IOStreams: genericiooptions.IOStreams{In: strings.NewReader(""), Out: &out, ErrOut: &errOut}}, args)
		if code != ExitPluginError || !strings.Contains(errOut.String(), tc.want) {
			t.Errorf("run %s: exit %d, stderr %q; want %d and %q", tc.args, code, errOut.String(), ExitPluginError, tc.want)
		}
	}
}

func TestTTLSeconds(t *testing.T) {
	for d, want := range map[time.Duration]*int32{0: nil, time.Hour: ptr.To[int32](3600), 1500 * time.Millisecond: ptr.To[int32](2)} {
		got, err := ttlSeconds(d)
		if err != nil || !ptr.Equal(got, want) {
			t.Errorf("ttlSeconds(%s) = %v, %v; want %v", d, ptr.Deref(got, -1), err, ptr.Deref(want, -1))
		}
	}
}
