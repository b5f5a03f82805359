package agent

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	agentv1 "github.com/bashtask/bashtask-operator/api/agent/v1"
)

func openTestStore(t *testing.T, stateDir string) *store {
	t.Helper()
	st, err := openStore(stateDir, filepath.Join(stateDir, "tasks"))
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// messages returns each UID's status message as recovery would see it.
func messages(t *testing.T, st *store) map[string]string {
	t.Helper()
	uids, loaded := st.records()
	got := map[string]string{}
	for _, uid := range uids {
		if err := loaded[uid].err; err != nil {
			t.Fatalf("%s: %v", uid, err)
		}
		got[uid] = loaded[uid].status.GetMessage()
	}
	return got
}

func TestJournalCompaction(t *testing.T) {
	dir := t.TempDir()
	st := openTestStore(t, dir)
	st.compactMin = 64 << 10
	write := func(uid, msg string) {
		t.Helper()
		if err := st.write(uid, &record{State: stateFinished}, &agentv1.TaskStatus{Message: msg}); err != nil {
			t.Fatal(err)
		}
	}
	pad := strings.Repeat("x", 1000)
	want := map[string]string{}
	for i := range 300 {
		uid := "u" + itoa(i)
		write(uid, "first "+pad)
		write(uid, "second "+uid)
		if i%10 == 0 {
			want[uid] = "second " + uid
			continue
		}
		if err := st.remove(uid); err != nil {
			t.Fatal(err)
		}
	}
	fi, err := os.Stat(st.path)
	if err != nil {
		t.Fatal(err)
	}
	// Without compaction the journal would hold every frame: over 300 kB.
	if fi.Size() > 4*st.compactMin {
		t.Errorf("journal is %d bytes after 300 tasks, 270 of them forgotten; want it compacted below %d", fi.Size(), 4*st.compactMin)
	}
	if fi.Size() != st.size {
		t.Errorf("journal is %d bytes on disk, %d by the store's count", fi.Size(), st.size)
	}
	if err := st.close(); err != nil {
		t.Fatal(err)
	}
	again := openTestStore(t, dir)
	defer again.close()
	if diff := cmp.Diff(want, messages(t, again)); diff != "" {
		t.Errorf("records after compaction and reopening (-want +got):\n%s", diff)
	}
	if again.damaged != nil {
		t.Errorf("a compacted journal reads as damaged: %v", again.damaged)
	}
}

func TestJournalDamage(t *testing.T) {
	dir := t.TempDir()
	st := openTestStore(t, dir)
	for _, uid := range []string{"a", "b", "c"} {
		if err := st.write(uid, &record{State: stateFinished}, &agentv1.TaskStatus{Message: "m-" + uid}); err != nil {
			t.Fatal(err)
		}
	}
	bRef := st.live["b"]
	if err := st.close(); err != nil {
		t.Fatal(err)
	}
	// One byte of b's record flips: a, before it, survives; b and what
	// follows are cut off, since frames after a bad one cannot be trusted
	// to start where its length says.
	f, err := os.OpenFile(filepath.Join(dir, "records.journal"), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte{'#'}, bRef.off+bRef.n-2); err != nil {
		t.Fatal(err)
	}
	f.Close()

	st = openTestStore(t, dir)
	if st.damaged == nil || !strings.Contains(st.damaged.Error(), "checksum") {
		t.Errorf("damage reported as %v, want a checksum failure", st.damaged)
	}
	if diff := cmp.Diff(map[string]string{"a": "m-a"}, messages(t, st)); diff != "" {
		t.Errorf("records after damage (-want +got):\n%s", diff)
	}
	// The journal goes on after the good part.
	if err := st.write("d", &record{State: stateFinished}, &agentv1.TaskStatus{Message: "m-d"}); err != nil {
		t.Fatal(err)
	}
	st.close()
	st = openTestStore(t, dir)
	defer st.close()
	if st.damaged != nil {
		t.Errorf("damage reported again after the cut: %v", st.damaged)
	}
	if diff := cmp.Diff(map[string]string{"a": "m-a", "d": "m-d"}, messages(t, st)); diff != "" {
		t.Errorf("records after writing past the cut (-want +got):\n%s", diff)
	}
}
