package exampletasks

import (
	"errors"
	"os/exec"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// TestRunCounterCountsEachExecution runs counting commands through bash
// as a task would and checks the tally per UID, including a UID that ran
// twice and one that never ran.
func TestRunCounterCountsEachExecution(t *testing.T) {
	c, err := NewRunCounter("127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	for _, uid := range []string{"uid-a", "uid-b", "uid-a"} {
		cmd := exec.Command("bash", "-c", c.Command("echo ran"))
		cmd.Env = []string{"BASHTASK_UID=" + uid}
		out, err := cmd.CombinedOutput()
		if err != nil || string(out) != "ran\n" {
			t.Fatalf("counting command for %s: %v, output %q", uid, err, out)
		}
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(map[string]int{"uid-a": 2, "uid-b": 1}, c.Runs()); diff != "" {
		t.Errorf("Runs() (-want +got):\n%s", diff)
	}
}

// TestRunCounterUnreachableFails checks that a command whose report cannot
// be sent fails instead of running uncounted.
func TestRunCounterUnreachableFails(t *testing.T) {
	c, err := NewRunCounter("127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	cmd := c.Command("echo ran")
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command("bash", "-c", cmd).CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 97 {
		t.Fatalf("counting command with the counter closed: %v, output %q; want exit 97", err, out)
	}
}
