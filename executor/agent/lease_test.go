package agent

import (
	"strings"
	"testing"

	"github.com/bashtask/bashtask-operator/executor"
)

func TestParseUIDRange(t *testing.T) {
	tests := map[string]struct {
		in      string
		want    UIDRange
		wantErr bool
	}{
		"default":     {in: "2000000-2065535", want: DefaultTaskUIDRange},
		"one id":      {in: "3000-3000", want: UIDRange{3000, 3000}},
		"reversed":    {in: "5-4", wantErr: true},
		"root":        {in: "0-10", wantErr: true},
		"nobody":      {in: "60000-70000", wantErr: true},
		"not a range": {in: "2000000", wantErr: true},
		"not numeric": {in: "a-b", wantErr: true},
		"invalid id":  {in: "4294967000-4294967295", wantErr: true},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got, err := ParseUIDRange(tc.in)
			if (err != nil) != tc.wantErr || got != tc.want {
				t.Errorf("ParseUIDRange(%q) = %v, %v; want %v, error %v", tc.in, got, err, tc.want, tc.wantErr)
			}
		})
	}
}

// No two live tasks share a UID; a returned UID is the last to be reused.
func TestUIDLeases(t *testing.T) {
	l := newUIDLeases(UIDRange{First: 10, Last: 12})
	a, _ := l.acquire("a")
	b, _ := l.acquire("b")
	if l.full() {
		t.Errorf("full with one id of three free")
	}
	l.hold(12, "recovered")
	l.hold(99, "out of range")
	if !l.full() {
		t.Errorf("not full with every id held")
	}
	if _, ok := l.acquire("c"); ok {
		t.Fatalf("a fourth lease from three ids")
	}
	l.release(99)
	l.release(a)
	c, ok := l.acquire("c")
	if !ok || c != a {
		t.Errorf("acquire after release = %d, %v; want %d", c, ok, a)
	}
	l.release(b)
	l.release(12)
	// The cursor stands after 10, the last one handed out.
	if d, _ := l.acquire("d"); d != 11 {
		t.Errorf("round robin: got %d, want 11", d)
	}
}

// A shared identity at the tenant level needs a user: the shim would
// otherwise stay root.
func TestSharedIdentityNeedsAUser(t *testing.T) {
	_, err := New(t.Context(), Config{
		NodeName: "n", StateDir: t.TempDir(),
		Executor:       executor.Config{Isolation: executor.IsolationTenant},
		SharedIdentity: true,
	})
	if err == nil || !strings.Contains(err.Error(), "--run-as-user") {
		t.Errorf("New: %v, want an error naming --run-as-user", err)
	}
}
