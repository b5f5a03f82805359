package client

import (
	"strings"
	"testing"
)

// ParsePortForward reads kubectl's spellings and refuses a port outside
// its bounds naming the specification and the bound.
func TestParsePortForward(t *testing.T) {
	for _, c := range []struct {
		spec string
		want ForwardedPort
		err  string
	}{
		{"8080:80", ForwardedPort{Local: 8080, Remote: 80}, ""},
		{":80", ForwardedPort{Remote: 80}, ""},
		{"0:80", ForwardedPort{Remote: 80}, ""},
		{"8000", ForwardedPort{Local: 8000, Remote: 8000}, ""},
		{"8080:0", ForwardedPort{}, `remote port "0" must be 1-65535`},
		{"8080:65536", ForwardedPort{}, `remote port "65536" must be 1-65535`},
		{"70000:80", ForwardedPort{}, `local port "70000" must be 0-65535`},
		{"x", ForwardedPort{}, `remote port "x" must be 1-65535`},
	} {
		got, err := ParsePortForward(c.spec)
		switch {
		case c.err == "" && (err != nil || got != c.want):
			t.Errorf("%q: %+v %v, want %+v", c.spec, got, err, c.want)
		case c.err != "" && (err == nil || !strings.Contains(err.Error(), c.err)):
			t.Errorf("%q: %v, want an error with %q", c.spec, err, c.err)
		}
	}
}
