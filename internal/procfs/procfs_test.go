package procfs

import (
	"os"
	"os/exec"
	"runtime"
	"slices"
	"testing"
)

func TestReadStat(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("/proc/<pid>/stat is Linux's")
	}
	// A command name with spaces and a parenthesis, as a process may
	// choose: fields must still be counted from the last ')'.
	dir := t.TempDir()
	name := dir + "/a b) c"
	if err := os.Symlink("/bin/sleep", name); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(name, "30")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })

	st, err := ReadStat(cmd.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	if st.PPID != os.Getpid() || st.StartTicks == 0 || st.State == 0 {
		t.Errorf("stat of the child: %+v, want parent %d and a start time", st, os.Getpid())
	}
	self, err := ReadStat(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if self.PGRP != st.PGRP || self.Session != st.Session {
		t.Errorf("child's group/session %d/%d, want the test's %d/%d", st.PGRP, st.Session, self.PGRP, self.Session)
	}
	if !slices.Contains(PIDs(), cmd.Process.Pid) {
		t.Errorf("PIDs does not list the child %d", cmd.Process.Pid)
	}
	if _, err := ReadStat(1 << 30); err == nil {
		t.Error("ReadStat of a pid that cannot exist: no error")
	}
}
