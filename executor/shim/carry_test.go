package shim

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestParseCarry(t *testing.T) {
	for name, c := range map[string]struct {
		rec  string
		over bool
		want Carry
	}{
		"dir":           {rec: "dir=/home/task/a b\x00end\x00", want: Carry{Recorded: true, Dir: "/home/task/a b"}},
		"env":           {rec: "dir=/x\x00env=A=1\x00env=B=x=y\nz\x00end\x00", want: Carry{Recorded: true, Dir: "/x", Env: []string{"A=1", "B=x=y\nz"}}},
		"empty":         {rec: "", want: Carry{Why: CarryNothing}},
		"no end":        {rec: "dir=/x\x00env=A=1\x00", want: Carry{Why: "the shell's record is incomplete (it was stopped while writing it)"}},
		"cut end":       {rec: "dir=/x\x00en", want: Carry{Why: "the shell's record is incomplete (it was stopped while writing it)"}},
		"over":          {rec: "dir=/x\x00end\x00", over: true, want: Carry{Why: "the shell's record is over 262144 bytes"}},
		"no dir":        {rec: "end\x00", want: Carry{Why: "the shell's record names no directory"}},
		"unknown field": {rec: "dir=/x\x00evil\x00end\x00", want: Carry{Why: `the shell's record has an unknown field "evil"`}},
	} {
		if diff := cmp.Diff(c.want, ParseCarry([]byte(c.rec), c.over)); diff != "" {
			t.Errorf("%s (-want +got):\n%s", name, diff)
		}
	}
	many := []byte("dir=/x\x00" + strings.Repeat("env=A=1\x00", MaxCarryEnv+1) + "end\x00")
	if c := ParseCarry(many, false); c.Recorded {
		t.Errorf("%d variables taken", MaxCarryEnv+1)
	}
}

// CarryRC under the node's bash: the traps record the directory and the
// exported variables after exit, a failure under set -eu and SIGTERM,
// keep the exit status, and unset BASH_ENV first.
func TestCarryRCInBash(t *testing.T) {
	bash, err := exec.LookPath("bash")
	if err != nil {
		t.Skip("no bash")
	}
	dir := t.TempDir()
	carry := filepath.Join(dir, "carry")
	rc := strings.ReplaceAll(string(CarryRC(true)), CarryPath, carry)
	rcPath := filepath.Join(dir, "rc")
	if err := os.WriteFile(rcPath, []byte(rc), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(dir, "sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	for name, c := range map[string]struct {
		command string
		code    int
		env     string // a NAME=VALUE the record must hold
	}{
		"exit":        {`cd sub; export FOO='a b'; exit 3`, 3, "FOO=a b"},
		"set -eu":     {`set -eu; cd sub; export FOO=x; false`, 1, "FOO=x"},
		"BASH_ENV":    {`cd sub; export FOO="${BASH_ENV-unset}"`, 0, "FOO=unset"},
		"SIGTERM":     {`cd sub; export FOO=t; sleep 5 & kill -TERM $$; wait`, 128 + 15, "FOO=t"},
		"noclobber":   {`set -C; cd sub; export FOO=c`, 0, "FOO=c"},
		"IFS changed": {`IFS=O; cd sub; export FOO=i`, 0, "FOO=i"},
	} {
		if err := os.WriteFile(carry, nil, 0o600); err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command(bash, "-c", c.command)
		cmd.Dir, cmd.Env = dir, []string{"BASH_ENV=" + rcPath, "PATH=/usr/bin:/bin"}
		err := cmd.Run()
		code := cmd.ProcessState.ExitCode()
		if code == -1 {
			code = 128 + 15
		}
		if code != c.code {
			t.Errorf("%s: exit %d (%v), want %d", name, code, err, c.code)
		}
		rec, _ := os.ReadFile(carry)
		got := ParseCarry(rec, false)
		if !got.Recorded || got.Dir != filepath.Join(dir, "sub") || !bytes.Contains(rec, []byte("env="+c.env+"\x00")) {
			t.Errorf("%s: record %q", name, rec)
		}
	}
}
