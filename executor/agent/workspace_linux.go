//go:build linux

package agent

import (
	"bufio"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/bashtask/bashtask-operator/internal/procfs"
)

// killUIDWait bounds the wait for the processes of a deleted workspace's
// UID to be gone after SIGKILL.
const killUIDWait = 5 * time.Second

// killUID kills every process whose real, effective or saved UID is uid
// and waits until none is left: what a workspace's tasks left outside
// their cgroups (there should be nothing; the tasks' cgroups are empty
// once they ended). Nothing else runs as a leased UID.
func killUID(uid uint32) error {
	deadline := time.Now().Add(killUIDWait)
	for {
		left := 0
		for _, pid := range procfs.PIDs() {
			if pid == os.Getpid() || !runsAs(pid, uid) {
				continue
			}
			left++
			_ = unix.Kill(pid, unix.SIGKILL)
		}
		if left == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%d processes of UID %d are left after SIGKILL", left, uid)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// runsAs reports whether a live process pid has uid as its real,
// effective or saved UID (/proc/<pid>/status "Uid:").
func runsAs(pid int, uid uint32) bool {
	f, err := os.Open("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return false
	}
	defer f.Close()
	want := strconv.FormatUint(uint64(uid), 10)
	sc := bufio.NewScanner(f)
	zombie := false
	for sc.Scan() {
		line := sc.Text()
		if v, ok := strings.CutPrefix(line, "State:"); ok {
			zombie = strings.HasPrefix(strings.TrimSpace(v), "Z")
		}
		if v, ok := strings.CutPrefix(line, "Uid:"); ok {
			f := strings.Fields(v)
			return !zombie && len(f) >= 3 && (f[0] == want || f[1] == want || f[2] == want)
		}
	}
	return false
}
