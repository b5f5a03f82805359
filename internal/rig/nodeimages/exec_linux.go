package nodeimages

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/bashtask/bashtask-operator/internal/mounts"
)

// groupStopGrace is how long a canceled command's process group has to
// exit after SIGTERM before Wait stops waiting for it.
const groupStopGrace = 30 * time.Second

// stopGroupOnCancel starts cmd in a process group of its own and makes a
// cancellation send SIGTERM to the whole group: debootstrap runs dpkg and
// maintainer scripts in the chroot, and killing debootstrap alone would
// leave them running, and its mounts in place. debootstrap unmounts what
// it mounted when it gets SIGTERM.
func stopGroupOnCancel(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error {
		err := unix.Kill(-cmd.Process.Pid, unix.SIGTERM)
		if errors.Is(err, unix.ESRCH) {
			return os.ErrProcessDone
		}
		return err
	}
	cmd.WaitDelay = groupStopGrace
}

// unmountUnder detaches every mount at or below dir, deepest first: a
// debootstrap that was killed leaves /proc and /sys mounted in its target,
// and removing the tree must not descend into them.
func unmountUnder(dir string) error {
	dir = filepath.Clean(dir)
	return mounts.UnmountUnder(dir)
}
