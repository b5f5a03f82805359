//go:build linux

package shim

import (
	"errors"
	"fmt"
	"io/fs"
	"os"

	"golang.org/x/sys/unix"
)

// The task's terminal (see [TerminalConfig]): its own devpts instance,
// mounted by the mount step, and the pair, opened by the terminal step
// as the task's UID and handed to the shell by superviseShell.

// devptsOptions are the task's devpts instance's: a new instance
// (nothing of the node's or another task's terminals in it), /dev/pts/ptmx
// usable by the task (its own /dev/ptmx leads there), slaves readable and
// writable by their owner, writable by their group (write(1)'s rule,
// mode=0620), owned by the UID and GID that open the master.
const devptsOptions = "newinstance,ptmxmode=0666,mode=0620"

// mountTerminalPts replaces the task's /dev/pts, a clone of the node's,
// with a devpts instance of its own and makes /dev/ptmx a link to its
// ptmx, for a task with a terminal; nothing for one without.
func mountTerminalPts(st *state) error {
	if st.cfg.Terminal == nil {
		return nil
	}
	if err := unix.Unmount("/dev/pts", unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("unmounting the node's /dev/pts: %w", err)
	}
	if err := os.MkdirAll("/dev/pts", 0o755); err != nil {
		return fmt.Errorf("making the task's /dev/pts: %w", err)
	}
	if err := unix.Mount("devpts", "/dev/pts", "devpts", unix.MS_NOSUID|unix.MS_NOEXEC, devptsOptions); err != nil {
		return fmt.Errorf("mounting the task's devpts on /dev/pts: %w", err)
	}
	if err := unix.Unmount("/dev/ptmx", unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("unmounting the node's /dev/ptmx: %w", err)
	}
	if err := os.Remove("/dev/ptmx"); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("removing the node's /dev/ptmx: %w", err)
	}
	if err := os.Symlink("pts/ptmx", "/dev/ptmx"); err != nil {
		return fmt.Errorf("making the task's /dev/ptmx: %w", err)
	}
	return nil
}

// terminalStep opens the task's terminal, after the identity step so that
// the slave is the task's UID's, sends the master to the parent on the
// config socket and keeps the slave for the shell (st.tty). It closes
// the config socket, which the shim kept open for this (see run).
func terminalStep(st *state) error {
	tc := st.cfg.Terminal
	if tc == nil {
		return nil
	}
	defer unix.Close(ConfigFD)
	master, slave, err := OpenPTY("/dev/pts/ptmx", WindowSize{Rows: tc.Rows, Cols: tc.Cols})
	if err != nil {
		return err
	}
	defer unix.Close(master)
	if err := unix.Sendmsg(ConfigFD, []byte{TerminalMessage}, unix.UnixRights(master), nil, 0); err != nil {
		unix.Close(slave)
		return fmt.Errorf("sending the terminal's master: %w", err)
	}
	st.tty = slave
	return nil
}

// WindowSize is a terminal's size in character cells.
type WindowSize struct {
	Rows, Cols uint16
}

// OpenPTY opens a new pseudo-terminal pair through the multiplexer ptmx
// (a devpts instance's ptmx, or /dev/ptmx): the master, unlocked, with
// the window size ws, and its slave (TIOCGPTPEER, which opens the very
// slave of this master whatever /dev/pts shows), both close-on-exec and
// neither a controlling terminal of the caller.
func OpenPTY(ptmx string, ws WindowSize) (master, slave int, err error) {
	master, err = unix.Open(ptmx, unix.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, -1, fmt.Errorf("opening %s: %w", ptmx, err)
	}
	defer func() {
		if err != nil {
			unix.Close(master)
		}
	}()
	if err := unix.IoctlSetPointerInt(master, unix.TIOCSPTLCK, 0); err != nil {
		return -1, -1, fmt.Errorf("unlocking the terminal: %w", err)
	}
	if err := unix.IoctlSetWinsize(master, unix.TIOCSWINSZ, &unix.Winsize{Row: ws.Rows, Col: ws.Cols}); err != nil {
		return -1, -1, fmt.Errorf("setting the terminal's window size: %w", err)
	}
	fd, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(master), unix.TIOCGPTPEER, uintptr(unix.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC))
	if errno != 0 {
		return -1, -1, fmt.Errorf("opening the terminal's slave: %w", errno)
	}
	return master, int(fd), nil
}
