package plugin

import (
	"strings"
	"testing"
)

// The fork flags are checked before any call, each error naming its flag.
func TestWorkspaceForkFlags(t *testing.T) {
	o, err := forkOptions("ns", "s1", workspaceForkFlags{count: 8, namePrefix: "try-"})
	if err != nil || o.Count != 8 || o.NamePrefix != "try-" || o.Source != "s1" || o.Namespace != "ns" || !o.NoWait {
		t.Errorf("--count 8 --name-prefix try- --wait 0: %+v %v", o, err)
	}
	for _, tc := range []struct {
		f    workspaceForkFlags
		want string
	}{
		{workspaceForkFlags{count: 0}, "--count 0"},
		{workspaceForkFlags{count: 65}, "--count 65"},
		{workspaceForkFlags{count: 1, namePrefix: strings.Repeat("p", 249)}, "--name-prefix"},
		{workspaceForkFlags{count: 1, node: strings.Repeat("n", 254)}, "--node"},
	} {
		if _, err := forkOptions("ns", "s1", tc.f); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: %v, want an error naming %s", tc.f, err, tc.want)
		}
	}
}
