package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// execute runs the command tree in-process and returns stdout.
func execute(t *testing.T, args ...string) (string, error) {
	t.Helper()
	root := newRootCommand()
	var out, errOut bytes.Buffer
	root.SetOut(&out)
	root.SetErr(&errOut)
	root.SetArgs(args)
	err := root.ExecuteContext(t.Context())
	return out.String(), err
}

func TestExecPrintsExactlyTheDocumentedKeys(t *testing.T) {
	spill := filepath.Join(t.TempDir(), "spill")
	out, err := execute(t, "exec", "--timeout=30s", "--grace=1s", "--spill-dir", spill, "--env", "GREETING=hi there", "--", "echo $GREETING; echo oops >&2; exit 3")
	if err != nil {
		t.Fatalf("exec: %v", err)
	}
	var generic map[string]any
	if err := json.Unmarshal([]byte(out), &generic); err != nil {
		t.Fatalf("output %q is not one JSON object: %v", out, err)
	}
	keys := func(m map[string]any) []string {
		var k []string
		for name := range m {
			k = append(k, name)
		}
		slices.Sort(k)
		return k
	}
	if diff := cmp.Diff([]string{"exitCode", "leftoverProcesses", "mechanism", "reason", "signal", "stderr", "stdout"}, keys(generic)); diff != "" {
		t.Errorf("top-level keys (-want +got):\n%s", diff)
	}
	streamKeys := []string{"sha256", "sanitized", "spillBytes", "spillComplete", "spillPath", "tail", "totalBytes", "truncated"}
	slices.Sort(streamKeys)
	for _, s := range []string{"stdout", "stderr"} {
		m, _ := generic[s].(map[string]any)
		if diff := cmp.Diff(streamKeys, keys(m)); diff != "" {
			t.Errorf("%s keys (-want +got):\n%s", s, diff)
		}
	}
	var got execOutput
	if err := json.Unmarshal([]byte(out), &got); err != nil {
		t.Fatal(err)
	}
	if got.Reason != "NonZeroExit" || got.ExitCode != 3 || got.Stdout.Tail != "hi there\n" || got.Stderr.Tail != "oops\n" {
		t.Errorf("result %+v", got)
	}
	if got.Stdout.SpillPath != filepath.Join(spill, "stdout") || !got.Stdout.SpillComplete {
		t.Errorf("spill %q complete %v", got.Stdout.SpillPath, got.Stdout.SpillComplete)
	}
	if got.Mechanism != "cgroup" && got.Mechanism != "processGroup" {
		t.Errorf("mechanism %q", got.Mechanism)
	}
}

func TestExecTimeoutAndStdin(t *testing.T) {
	stdin := filepath.Join(t.TempDir(), "in")
	if err := os.WriteFile(stdin, []byte("12345"), 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := execute(t, "exec", "--stdin-file", stdin, "--spill-dir", filepath.Join(t.TempDir(), "s"), "--", "wc", "-c")
	if err != nil || !strings.Contains(out, `"tail":"5\n"`) {
		t.Errorf("stdin: %v %s", err, out)
	}
	out, err = execute(t, "exec", "--timeout=500ms", "--grace=200ms", "--spill-dir", filepath.Join(t.TempDir(), "s"), "--", "sleep 30")
	var got execOutput
	if err != nil || json.Unmarshal([]byte(out), &got) != nil || got.Reason != "TimedOut" {
		t.Errorf("timeout: %v %s", err, out)
	}
}

func TestExecStartFailed(t *testing.T) {
	out, err := execute(t, "exec", "--workdir", "/does/not/exist", "--", "true")
	if !errors.Is(err, errStartFailed) {
		t.Fatalf("error %v, want errStartFailed", err)
	}
	var got execOutput
	if err := json.Unmarshal([]byte(out), &got); err != nil || got.Reason != "StartFailed" {
		t.Errorf("output %q", out)
	}
}

func TestExecRejectsBadFlags(t *testing.T) {
	if _, err := execute(t, "exec", "--ambient-env=everything", "--", "true"); err == nil {
		t.Errorf("unknown ambient mode accepted")
	}
	if _, err := execute(t, "exec", "--env", "NOEQUALS", "--", "true"); err == nil {
		t.Errorf("--env without '=' accepted")
	}
}
