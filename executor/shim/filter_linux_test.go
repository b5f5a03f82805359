//go:build linux

package shim

import (
	"bytes"
	"os/exec"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"golang.org/x/sys/unix"

	"github.com/bashtask/bashtask-operator/executor/seccomp"
	"github.com/bashtask/bashtask-operator/internal/rig/testutil"
)

// The filter the agent assembles comes out of the Config as it went in.
func TestFilterRoundTrip(t *testing.T) {
	prog, err := seccomp.Assemble()
	if err != nil {
		// The agent refuses the tenant level on such an architecture.
		testutil.SkipUnlessStrictf(t, "no seccomp filter for this architecture: %v", err)
	}
	b, err := EncodeFilter(prog)
	if err != nil {
		t.Fatal(err)
	}
	if len(b) != len(prog)*8 {
		t.Fatalf("%d instructions encoded in %d bytes, want 8 each", len(prog), len(b))
	}
	got, err := decodeFilter(b)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(prog, got); diff != "" {
		t.Errorf("(-assembled +decoded)\n%s", diff)
	}
	// Each field lands in its own place.
	one, err := EncodeFilter([]unix.SockFilter{{Code: 0x1234, Jt: 5, Jf: 6, K: 0x789abcde}})
	if err != nil {
		t.Fatal(err)
	}
	back, err := decodeFilter(one)
	if err != nil || back[0] != (unix.SockFilter{Code: 0x1234, Jt: 5, Jf: 6, K: 0x789abcde}) {
		t.Errorf("one instruction: %+v, %v", back, err)
	}
}

// A Config whose filter is not whole instructions, empty or past the
// kernel's limit is refused by name before any step runs.
func TestFilterDecodeRefuses(t *testing.T) {
	for _, tc := range []struct {
		name string
		b    []byte
		want string
	}{
		{"partial", make([]byte, 12), "not a whole number"},
		{"empty", nil, "empty seccomp filter"},
		{"too long", bytes.Repeat([]byte{6, 0, 0, 0, 0, 0, 0xff, 0x7f}, maxFilterInsns+1), "BPF_MAXINSNS"},
	} {
		if _, err := decodeFilter(tc.b); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want an error with %q", tc.name, err, tc.want)
		}
	}
	// The agent's side refuses the same bounds when it encodes.
	for _, n := range []int{0, maxFilterInsns + 1} {
		if _, err := EncodeFilter(make([]unix.SockFilter, n)); err == nil || !strings.Contains(err.Error(), "BPF_MAXINSNS") {
			t.Errorf("encoding %d instructions: %v, want an error naming BPF_MAXINSNS", n, err)
		}
	}
}

// The shim's binary loads the filter it is given: it must not link the
// system-call tables (go-seccomp-bpf's arch package builds them in its
// init, in every shim's start; the agent assembles the filter once).
func TestShimBinaryLinksNoSyscallTables(t *testing.T) {
	goTool, err := exec.LookPath("go")
	if err != nil {
		testutil.SkipUnlessStrictf(t, "no go tool to list the shim binary's packages: %v", err)
	}
	out, err := exec.Command(goTool, "list", "-deps", "github.com/bashtask/bashtask-operator/cmd/bashtask-shim").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	for _, pkg := range strings.Fields(string(out)) {
		if strings.Contains(pkg, "go-seccomp-bpf") || strings.HasSuffix(pkg, "/executor/seccomp") {
			t.Errorf("cmd/bashtask-shim links %s", pkg)
		}
	}
}
