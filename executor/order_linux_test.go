package executor

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/bashtask/bashtask-operator/internal/outputorder"
)

// combined frames the ended task's spill files in the order its journal
// recorded and returns the payloads as "out:" and "err:" lines.
func combined(t *testing.T, spillDir string, res Result) []string {
	t.Helper()
	journal, err := os.ReadFile(filepath.Join(spillDir, outputorder.Name))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
	var p outputorder.Parser
	var recs []outputorder.Record
	if err := p.Feed(journal, func(r outputorder.Record) error { recs = append(recs, r); return nil }); err != nil {
		t.Fatal(err)
	}
	recs = append(recs, outputorder.Rest(p.Sums, [3]int64{0, res.Stdout.TotalBytes, res.Stderr.TotalBytes})...)
	streams := [3][]byte{}
	for _, s := range []struct {
		id   byte
		name string
	}{{outputorder.Stdout, "stdout"}, {outputorder.Stderr, "stderr"}} {
		b, err := os.ReadFile(filepath.Join(spillDir, s.name))
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			t.Fatal(err)
		}
		streams[s.id] = b
	}
	var lines []string
	var c outputorder.Cursor
	for _, r := range recs {
		_ = c.Walk(r, 0, func(pc outputorder.Piece) error {
			if len(pc.Header) == 0 {
				tag := map[byte]string{outputorder.Stdout: "out:", outputorder.Stderr: "err:"}[pc.Stream]
				for _, l := range strings.SplitAfter(string(streams[pc.Stream][pc.Offset:pc.Offset+pc.Len]), "\n") {
					if l != "" {
						lines = append(lines, tag+strings.TrimSuffix(l, "\n"))
					}
				}
			}
			return nil
		})
	}
	return lines
}

// TestOrderJournal: a command that alternates between its streams reads
// back in that order through the journal, while each stream stays whole
// on its own; a command printing to one stream writes no journal.
func TestOrderJournal(t *testing.T) {
	forEachMechanism(t, func(t *testing.T, ex *Executor) {
		spec := testSpec(t, `for i in 1 2 3 4 5; do echo out$i; sleep 0.1; echo err$i >&2; sleep 0.1; done`)
		res := run(t, ex, spec)
		var want []string
		for i := 1; i <= 5; i++ {
			want = append(want, fmt.Sprintf("out:out%d", i), fmt.Sprintf("err:err%d", i))
		}
		if got := combined(t, spec.SpillDir, res); strings.Join(got, " ") != strings.Join(want, " ") {
			t.Errorf("combined view %q, want %q", got, want)
		}
		if res.Stdout.Tail != "out1\nout2\nout3\nout4\nout5\n" || res.Stderr.Tail != "err1\nerr2\nerr3\nerr4\nerr5\n" {
			t.Errorf("streams on their own: %q, %q", res.Stdout.Tail, res.Stderr.Tail)
		}

		one := testSpec(t, `echo a; echo b`)
		run(t, ex, one)
		if _, err := os.Lstat(filepath.Join(one.SpillDir, outputorder.Name)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("a task printing to stdout alone left a journal: %v", err)
		}
	})
}

// TestOrderSealForFollower: a follower's Order(true) turns the run being
// read into a record at once, so it can frame the bytes while the task
// runs; later bytes of the same stream start a new record.
func TestOrderSealForFollower(t *testing.T) {
	ex := newTestExecutor(t, CgroupOff)
	spec := testSpec(t, `echo first; read -r _ < /dev/stdin; echo second`)
	spec.StdinStream = &StdinStream{}
	task, err := ex.Start(spec)
	if err != nil {
		t.Fatal(err)
	}
	waitForOutput(t, task, "first\n")
	st := task.Order(true)
	if st.Records != 1 || st.Bytes != 2 || st.Stopped {
		t.Fatalf("after the seal: %+v, want one record in 2 bytes", st)
	}
	if b, _ := os.ReadFile(st.Path); len(b) != 2 || b[0] != outputorder.Version || b[1] != 6<<1 {
		t.Fatalf("journal %v, want the version and stdout's 6 bytes", b)
	}
	if _, err := task.WriteStdin(t.Context(), 0, []byte("go\n"), true); err != nil {
		t.Fatal(err)
	}
	res := wait(t, task)
	if got := combined(t, spec.SpillDir, res); strings.Join(got, " ") != "out:first out:second" {
		t.Fatalf("combined view %q", got)
	}
	if st := task.Order(true); st.Records != 1 || !st.Stopped {
		t.Fatalf("after the end: %+v, want the last run left to the rest", st)
	}
}
