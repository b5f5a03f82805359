// Package procfs reads Linux's process table from /proc (proc(5)): the
// process ids, the fields of /proc/<pid>/stat that the executor, the agent
// and the benchmark use, and the memory figures of /proc/<pid>/status the
// benchmarks report. On other systems every read fails.
package procfs

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// ClockTicks is USER_HZ, the unit of the times in /proc/<pid>/stat: 100 on
// every Linux architecture Go supports (sysconf(_SC_CLK_TCK)).
const ClockTicks = 100

// Stat is part of /proc/<pid>/stat. Field numbers are those of proc(5).
type Stat struct {
	// State is field 3: 'R', 'S', 'D', 'Z' (zombie), 'T', ...
	State byte
	// PPID, PGRP and Session are fields 4, 5 and 6.
	PPID, PGRP, Session int
	// UTime and STime (fields 14, 15) are the process's own user and
	// system time; CUTime and CSTime (16, 17) those of its children that
	// ended and were waited for. All in clock ticks (ClockTicks a second).
	UTime, STime, CUTime, CSTime int64
	// StartTicks is field 22, the start time in clock ticks after boot:
	// with the pid it tells a process from a later one that reused its id.
	StartTicks uint64
}

// ReadStat reads /proc/<pid>/stat. The command name (field 2) may hold
// spaces and parentheses, so fields are counted after its last ')'. It
// returns the read error (a process that is gone: fs.ErrNotExist) or one
// that names a malformed line.
func ReadStat(pid int) (Stat, error) {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return Stat{}, err
	}
	malformed := func(err error) (Stat, error) {
		return Stat{}, fmt.Errorf("malformed /proc/%d/stat: %w", pid, err)
	}
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return malformed(fmt.Errorf("no ')' after the command name"))
	}
	// f[0] is field 3, so field n is f[n-3].
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 20 || len(f[0]) != 1 {
		return malformed(fmt.Errorf("%d fields after the command name", len(f)))
	}
	var st Stat
	st.State = f[0][0]
	for _, p := range []struct {
		dst *int
		n   int
	}{{&st.PPID, 4}, {&st.PGRP, 5}, {&st.Session, 6}} {
		if *p.dst, err = strconv.Atoi(f[p.n-3]); err != nil {
			return malformed(err)
		}
	}
	for _, p := range []struct {
		dst *int64
		n   int
	}{{&st.UTime, 14}, {&st.STime, 15}, {&st.CUTime, 16}, {&st.CSTime, 17}} {
		if *p.dst, err = strconv.ParseInt(f[p.n-3], 10, 64); err != nil {
			return malformed(err)
		}
	}
	if st.StartTicks, err = strconv.ParseUint(f[22-3], 10, 64); err != nil {
		return malformed(err)
	}
	return st, nil
}

// Memory is part of /proc/<pid>/status, in bytes.
type Memory struct {
	// RSS is VmRSS, the resident set size now.
	RSS int64
	// HWM is VmHWM, the peak resident set size since the process started
	// or since ResetPeak.
	HWM int64
}

// ReadMemory reads VmRSS and VmHWM of /proc/<pid>/status. A kernel thread
// or a zombie has neither: an error names the missing field.
func ReadMemory(pid int) (Memory, error) {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "status"))
	if err != nil {
		return Memory{}, err
	}
	var m Memory
	var gotRSS, gotHWM bool
	for _, line := range strings.Split(string(b), "\n") {
		name, rest, ok := strings.Cut(line, ":")
		if !ok || (name != "VmRSS" && name != "VmHWM") {
			continue
		}
		f := strings.Fields(rest)
		if len(f) != 2 || f[1] != "kB" {
			return Memory{}, fmt.Errorf("malformed %s in /proc/%d/status: %q", name, pid, line)
		}
		kb, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil {
			return Memory{}, fmt.Errorf("malformed %s in /proc/%d/status: %w", name, pid, err)
		}
		if name == "VmRSS" {
			m.RSS, gotRSS = kb<<10, true
		} else {
			m.HWM, gotHWM = kb<<10, true
		}
	}
	if !gotRSS || !gotHWM {
		return Memory{}, fmt.Errorf("/proc/%d/status has no VmRSS and VmHWM", pid)
	}
	return m, nil
}

// ResetPeak sets the process's VmHWM to its current RSS (writing 5 to
// /proc/<pid>/clear_refs), so that a later ReadMemory reports the peak of
// what came after. It needs the right to write the process's clear_refs:
// the same user, or root.
func ResetPeak(pid int) error {
	return os.WriteFile(filepath.Join("/proc", strconv.Itoa(pid), "clear_refs"), []byte("5"), 0)
}

// PIDs lists the process ids in /proc; nil when /proc cannot be read.
func PIDs() []int {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	var out []int
	for _, e := range entries {
		if pid, err := strconv.Atoi(e.Name()); err == nil {
			out = append(out, pid)
		}
	}
	return out
}
