//go:build linux

package executor

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/bashtask/bashtask-operator/internal/mounts"
)

// limitControllers are the controllers a task's limits need; New enables
// each one the node offers to the parent cgroup.
var limitControllers = []string{"cpu", "memory", "pids"}

// setupCgroupParent finds a writable cgroup v2 directory (root, or detected)
// and creates the parent cgroup name in it. It returns ErrNoCgroupV2 with
// the reasons of every candidate when none works.
func setupCgroupParent(root, name string) (*cgroupParent, error) {
	candidates := []string{root}
	if root == "" {
		var err error
		candidates, err = cgroup2Candidates()
		if err != nil {
			return nil, fmt.Errorf("%w: %w", ErrNoCgroupV2, err)
		}
		if len(candidates) == 0 {
			return nil, fmt.Errorf("%w: no cgroup2 mount in /proc/self/mountinfo", ErrNoCgroupV2)
		}
	}
	var errs []error
	for _, base := range candidates {
		cg, err := makeCgroupParent(filepath.Join(base, name))
		if err == nil {
			return cg, nil
		}
		errs = append(errs, err)
	}
	return nil, fmt.Errorf("%w: %w", ErrNoCgroupV2, errors.Join(errs...))
}

// cgroup2Candidates lists directories where the parent cgroup may go, best
// first: the process's own cgroup inside each cgroup2 mount (the place a
// delegating supervisor such as systemd with Delegate=yes hands over), then
// the mount point itself.
func cgroup2Candidates() ([]string, error) {
	mountinfo, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	own := ""
	if cg, err := os.ReadFile("/proc/self/cgroup"); err == nil {
		for line := range strings.SplitSeq(string(cg), "\n") {
			if p, ok := strings.CutPrefix(line, "0::"); ok {
				own = p
			}
		}
	}
	var out []string
	for _, m := range parseCgroup2Mounts(string(mountinfo)) {
		if own != "" {
			if rel, ok := strings.CutPrefix(own, m.root); ok && (m.root == "/" || rel == "" || rel[0] == '/') {
				dir := filepath.Join(m.point, rel)
				if fi, err := os.Stat(dir); err == nil && fi.IsDir() && !slices.Contains(out, dir) {
					out = append(out, dir)
				}
			}
		}
		if !slices.Contains(out, m.point) {
			out = append(out, m.point)
		}
	}
	return out, nil
}

type cgroupMount struct{ root, point string }

// parseCgroup2Mounts returns the cgroup2 mounts of a mountinfo text
// (proc(5): "id parent maj:min root mountpoint options [optional...] -
// fstype source superoptions").
func parseCgroup2Mounts(mountinfo string) []cgroupMount {
	var out []cgroupMount
	for line := range strings.SplitSeq(mountinfo, "\n") {
		fields := strings.Fields(line)
		sep := slices.Index(fields, "-")
		if sep < 5 || sep+1 >= len(fields) || fields[sep+1] != "cgroup2" {
			continue
		}
		out = append(out, cgroupMount{root: mounts.Unescape(fields[3]), point: mounts.Unescape(fields[4])})
	}
	return out
}

// makeCgroupParent creates (or adopts) the parent cgroup at path, proves it
// writable by creating and removing a probe child, and enables the limit
// controllers the node offers there.
func makeCgroupParent(path string) (*cgroupParent, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(filepath.Dir(path), &st); err != nil {
		return nil, fmt.Errorf("statfs %s: %w", filepath.Dir(path), err)
	}
	if st.Type != unix.CGROUP2_SUPER_MAGIC {
		return nil, fmt.Errorf("%s is not on a cgroup2 file system", filepath.Dir(path))
	}
	created := true
	if err := os.Mkdir(path, 0o755); err != nil {
		if !errors.Is(err, os.ErrExist) {
			return nil, fmt.Errorf("creating parent cgroup: %w", err)
		}
		created = false
	}
	probe := filepath.Join(path, "probe-"+randomName())
	if err := os.Mkdir(probe, 0o755); err != nil {
		if created {
			os.Remove(path)
		}
		return nil, fmt.Errorf("creating a cgroup in %s: %w", path, err)
	}
	if err := os.Remove(probe); err != nil {
		return nil, fmt.Errorf("removing probe cgroup %s: %w", probe, err)
	}
	offered, _ := os.ReadFile(filepath.Join(path, "cgroup.controllers"))
	for _, c := range limitControllers {
		if slices.Contains(strings.Fields(string(offered)), c) {
			// Best effort: enabling fails when the node did not delegate
			// the controller; limits then are reported as not enforced.
			_ = os.WriteFile(filepath.Join(path, "cgroup.subtree_control"), []byte("+"+c), 0)
		}
	}
	enabled, err := os.ReadFile(filepath.Join(path, "cgroup.subtree_control"))
	if err != nil {
		return nil, fmt.Errorf("reading %s/cgroup.subtree_control: %w", path, err)
	}
	return &cgroupParent{path: path, created: created, controllers: strings.Fields(string(enabled))}, nil
}

func randomName() string {
	var b [8]byte
	_, _ = rand.Read(b[:]) // never fails on Linux (getrandom)
	return hex.EncodeToString(b[:])
}

// taskCgroup is one task's cgroup.
type taskCgroup struct {
	path string
	fd   int // open directory for CLONE_INTO_CGROUP; -1 once closed
}

// create makes the task cgroup name with limits. notEnforced names the
// requested limits whose controller is not enabled for task cgroups.
func (p *cgroupParent) create(name string, l Limits) (cg *taskCgroup, notEnforced []string, err error) {
	if cg, err = p.newCgroup(name); err != nil {
		return nil, nil, err
	}
	if notEnforced, err = p.limit(cg, l); err != nil {
		cg.closeFD()
		_ = os.Remove(cg.path)
		return nil, nil, err
	}
	return cg, notEnforced, nil
}

// newCgroup makes the task cgroup name without limits and opens it for
// CLONE_INTO_CGROUP.
func (p *cgroupParent) newCgroup(name string) (*taskCgroup, error) {
	path := filepath.Join(p.path, name)
	if err := os.Mkdir(path, 0o755); err != nil {
		if !errors.Is(err, os.ErrExist) {
			return nil, fmt.Errorf("creating task cgroup: %w", err)
		}
		// A cgroup of this name outlived an earlier run (an agent or test
		// process killed before it removed it). Empty, it is stale and is
		// replaced; with live processes it is someone's, and left alone.
		stale := &taskCgroup{path: path, fd: -1}
		if stale.populated() {
			return nil, fmt.Errorf("creating task cgroup: %s exists and holds processes", path)
		}
		if err := removeCgroupTree(path); err != nil {
			return nil, fmt.Errorf("replacing the stale task cgroup %s: %w", path, err)
		}
		if err := os.Mkdir(path, 0o755); err != nil {
			return nil, fmt.Errorf("creating task cgroup: %w", err)
		}
	}
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		_ = os.Remove(path)
		return nil, fmt.Errorf("opening task cgroup: %w", err)
	}
	return &taskCgroup{path: path, fd: fd}, nil
}

// limit writes l into cg. notEnforced names the requested limits whose
// controller is not enabled for task cgroups.
func (p *cgroupParent) limit(cg *taskCgroup, l Limits) (notEnforced []string, err error) {
	type setting struct{ file, value string }
	var settings []setting
	want := func(controller string, s ...setting) {
		if slices.Contains(p.controllers, controller) {
			settings = append(settings, s...)
		} else {
			notEnforced = append(notEnforced, controller)
		}
	}
	if l.MemoryBytes > 0 {
		// No swap, so the limit means what it says, and oom.group so the
		// OOM killer takes the whole task rather than one process the
		// shell then reports as a plain SIGKILL.
		want("memory",
			setting{"memory.max", strconv.FormatInt(l.MemoryBytes, 10)},
			setting{"memory.swap.max", "0"},
			setting{"memory.oom.group", "1"})
	}
	if l.CPUMillis > 0 {
		const period = 100000 // microseconds, the kernel default
		want("cpu", setting{"cpu.max", fmt.Sprintf("%d %d", max(l.CPUMillis*period/1000, 1000), period)})
	}
	if l.Pids > 0 {
		want("pids", setting{"pids.max", strconv.FormatInt(l.Pids, 10)})
	}
	for _, s := range settings {
		err := os.WriteFile(filepath.Join(cg.path, s.file), []byte(s.value), 0)
		// memory.swap.max exists only with swap accounting; without it there
		// is no swap to forbid.
		if err != nil && (s.file != "memory.swap.max" || !errors.Is(err, os.ErrNotExist)) {
			return nil, fmt.Errorf("setting %s of task cgroup: %w", s.file, err)
		}
	}
	return notEnforced, nil
}

func (cg *taskCgroup) closeFD() {
	if cg.fd >= 0 {
		unix.Close(cg.fd)
		cg.fd = -1
	}
}

// populated reports whether any live process is in the cgroup. Exited
// processes leave the cgroup before their parent is notified, so a reaped
// shell never counts. On a read error it answers true: a cgroup that
// cannot be read is not known to be empty.
func (cg *taskCgroup) populated() bool {
	b, err := os.ReadFile(filepath.Join(cg.path, "cgroup.events"))
	if err != nil {
		return true
	}
	i := bytes.Index(b, []byte("populated "))
	return i < 0 || i+10 >= len(b) || b[i+10] != '0'
}

// procs lists the processes in the cgroup.
func (cg *taskCgroup) procs() []int {
	out, _ := CgroupProcs(cg.path)
	return out
}

// CgroupProcs lists the processes of the cgroup v2 at path (its
// cgroup.procs). The error is the read's: os.ErrNotExist when the cgroup
// is gone.
func CgroupProcs(path string) ([]int, error) {
	b, err := os.ReadFile(filepath.Join(path, "cgroup.procs"))
	if err != nil {
		return nil, err
	}
	var out []int
	for f := range strings.FieldsSeq(string(b)) {
		if pid, err := strconv.Atoi(f); err == nil {
			out = append(out, pid)
		}
	}
	return out, nil
}

// KillCgroup kills every process of the cgroup v2 at path with SIGKILL
// (see taskCgroup.kill), waits up to two seconds for it to empty, and
// removes it and its child cgroups, waiting up to five seconds while the
// kernel reports it busy: a killed process stays charged to the cgroup
// until its parent reaps it, and the parent of an earlier agent's process
// is the node's init or subreaper. It returns the pids it found; a
// missing cgroup is no error. For what an earlier agent or executor left:
// a task's cgroup, a pooled shim's.
func KillCgroup(path string) ([]int, error) {
	procs, err := CgroupProcs(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading cgroup %s: %w", path, err)
	}
	if len(procs) > 0 {
		(&taskCgroup{path: path, fd: -1}).kill()
	}
	deadline := time.Now().Add(2 * time.Second)
	for {
		left, err := CgroupProcs(path)
		if err != nil || len(left) == 0 {
			break
		}
		if time.Now().After(deadline) {
			return procs, fmt.Errorf("cgroup %s still has %d processes after SIGKILL", path, len(left))
		}
		time.Sleep(20 * time.Millisecond)
	}
	return procs, removeCgroupTreeWithin(path, 5*time.Second)
}

// kill sends SIGKILL to every process in the cgroup. cgroup.kill (Linux
// 5.14) does it atomically, including processes forked meanwhile; older
// kernels get one pass over cgroup.procs.
func (cg *taskCgroup) kill() {
	err := os.WriteFile(filepath.Join(cg.path, "cgroup.kill"), []byte("1"), 0)
	if err == nil {
		return
	}
	for _, pid := range cg.procs() {
		_ = unix.Kill(pid, unix.SIGKILL)
	}
}

// oomKilled reports whether the OOM killer killed a process of the cgroup
// (memory.events; the file exists only with the memory controller).
func (cg *taskCgroup) oomKilled() bool {
	b, err := os.ReadFile(filepath.Join(cg.path, "memory.events"))
	if err != nil {
		return false
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		k, v, _ := strings.Cut(line, " ")
		if (k == "oom_kill" || k == "oom_group_kill") && v != "0" && v != "" {
			return true
		}
	}
	return false
}

// remove deletes the cgroup once it is empty.
func (cg *taskCgroup) remove() error {
	cg.closeFD()
	return removeCgroup(cg.path)
}

// removeCgroupTree removes an unpopulated cgroup and its child cgroups,
// children first (rmdir(2) only removes a cgroup without children).
func removeCgroupTree(path string) error { return removeCgroupTreeWithin(path, removeBusyWait) }

// removeCgroupTreeWithin is removeCgroupTree waiting up to busy on each
// cgroup the kernel reports busy.
func removeCgroupTreeWithin(path string, busy time.Duration) error {
	entries, err := os.ReadDir(path)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	for _, e := range entries {
		if e.IsDir() {
			if err := removeCgroupTreeWithin(filepath.Join(path, e.Name()), busy); err != nil {
				return err
			}
		}
	}
	return removeCgroupWithin(path, busy)
}

// removeBusyWait is how long removeCgroup retries a cgroup the kernel
// reports busy while the last exiting process is still being torn down.
const removeBusyWait = 500 * time.Millisecond

// removeCgroup removes an empty cgroup directory, retrying for a moment
// (removeBusyWait) while the kernel reports EBUSY.
func removeCgroup(path string) error { return removeCgroupWithin(path, removeBusyWait) }

// removeCgroupWithin is removeCgroup retrying EBUSY for up to busy, with
// delays doubling from a millisecond to 20 ms.
func removeCgroupWithin(path string, busy time.Duration) error {
	deadline := time.Now().Add(busy)
	delay := time.Millisecond
	for {
		err := unix.Rmdir(path)
		if err == nil || errors.Is(err, unix.ENOENT) {
			return nil
		}
		if !errors.Is(err, unix.EBUSY) || time.Now().After(deadline) {
			return fmt.Errorf("removing cgroup %s: %w", path, err)
		}
		time.Sleep(delay)
		delay = min(2*delay, 20*time.Millisecond)
	}
}
