package procfs

import (
	"io"
	"os"
	"os/exec"
	"runtime"
	"runtime/debug"
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

// peakChildEnv makes the test binary the child of TestReadMemory.
const peakChildEnv = "PROCFS_TEST_PEAK_CHILD"

func TestMain(m *testing.M) {
	if os.Getenv(peakChildEnv) == "1" {
		// Touch 64 MiB, give them back to the system, say so, and wait
		// for stdin to close.
		b := make([]byte, 64<<20)
		for i := range b {
			b[i] = 1
		}
		runtime.KeepAlive(b) // then dead: the collection frees it
		debug.FreeOSMemory()
		_, _ = os.Stdout.WriteString("freed\n")
		_, _ = io.Copy(io.Discard, os.Stdin)
		os.Exit(0)
	}
	os.Exit(m.Run())
}

func TestReadMemory(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("/proc/<pid>/status is Linux's")
	}
	// A child that touched 64 MiB and freed them: its peak holds them
	// until ResetPeak.
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), peakChildEnv+"=1")
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = stdin.Close(); _ = cmd.Wait() })
	if _, err := io.ReadFull(stdout, make([]byte, len("freed\n"))); err != nil {
		t.Fatal(err)
	}
	m, err := ReadMemory(cmd.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	if m.RSS <= 0 || m.HWM < m.RSS+60<<20 {
		t.Fatalf("memory of a child that freed 64 MiB: %+v, want its peak 64 MiB above its RSS", m)
	}
	if err := ResetPeak(cmd.Process.Pid); err != nil {
		t.Fatal(err)
	}
	after, err := ReadMemory(cmd.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	if after.HWM > m.RSS+8<<20 {
		t.Errorf("peak after ResetPeak %d, want about the RSS %d", after.HWM, m.RSS)
	}
	if _, err := ReadMemory(1 << 30); err == nil {
		t.Error("ReadMemory of a pid that cannot exist: no error")
	}
}
