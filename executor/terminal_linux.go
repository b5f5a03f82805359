//go:build linux

package executor

import (
	"errors"
	"fmt"
	"os"

	"golang.org/x/sys/unix"

	"github.com/bashtask/bashtask-operator/executor/shim"
)

// resizeTerminal sets master's window size (TIOCSWINSZ).
func resizeTerminal(master *os.File, ws WindowSize) error {
	rc, err := master.SyscallConn()
	if err != nil {
		return err
	}
	var ioErr error
	if err := rc.Control(func(fd uintptr) {
		ioErr = unix.IoctlSetWinsize(int(fd), unix.TIOCSWINSZ, &unix.Winsize{Row: ws.Rows, Col: ws.Cols})
	}); err != nil {
		return os.ErrClosed // Control fails only on a closed file (poll's ErrFileClosing, which os.File's methods report as this)
	}
	return ioErr
}

// isTerminalGone reports whether err is the master's after every slave
// descriptor closed (EIO).
func isTerminalGone(err error) bool { return errors.Is(err, unix.EIO) }

// masterFile makes fd, a terminal's master, the executor's *os.File: non-
// blocking and in the runtime's poller, so that the stdout reader can be
// cut with a deadline (drainOutput) and a write waits without a thread.
func masterFile(fd int) (*os.File, error) {
	if err := unix.SetNonblock(fd, true); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("the terminal's master: %w", err)
	}
	return os.NewFile(uintptr(fd), "ptmx"), nil
}

// openNodeTerminal opens a terminal for a task at the process level, on
// the node's /dev/ptmx, with the slave owned by the task's user (when
// it has one) so that it may reopen it by name. It returns the master,
// in the poller, and the slave.
func openNodeTerminal(p *prepared) (master, slave *os.File, err error) {
	m, s, err := shim.OpenPTY("/dev/ptmx", shim.WindowSize(p.Terminal.Size))
	if err != nil {
		return nil, nil, startErr(ErrProcessStart, "opening the task's terminal", err)
	}
	if u := p.User; u != nil {
		if err := unix.Fchown(s, int(u.UID), int(u.GID)); err != nil {
			unix.Close(m)
			unix.Close(s)
			return nil, nil, startErr(ErrProcessStart, "giving the task's terminal to its user", err)
		}
	}
	mf, err := masterFile(m)
	if err != nil {
		unix.Close(s)
		return nil, nil, startErr(ErrProcessStart, "", err)
	}
	return mf, os.NewFile(uintptr(s), "pts"), nil
}

// receiveMaster reads the terminal's master from the shim's config
// socket (shim.TerminalConfig) and closes the socket. The shim sent it
// before its "started" report, which the caller has read.
func receiveMaster(sock *os.File) (*os.File, error) {
	defer sock.Close()
	buf := make([]byte, 1)
	oob := make([]byte, unix.CmsgSpace(4))
	n, oobn, _, _, err := unix.Recvmsg(int(sock.Fd()), buf, oob, unix.MSG_CMSG_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("receiving the terminal's master from the shim: %w", err)
	}
	var fds []int
	if msgs, err := unix.ParseSocketControlMessage(oob[:oobn]); err == nil {
		for _, m := range msgs {
			if rights, err := unix.ParseUnixRights(&m); err == nil {
				fds = append(fds, rights...)
			}
		}
	}
	if n != 1 || buf[0] != shim.TerminalMessage || len(fds) != 1 {
		for _, fd := range fds {
			unix.Close(fd)
		}
		return nil, fmt.Errorf("the shim sent %d bytes and %d descriptors, not the terminal's master", n, len(fds))
	}
	return masterFile(fds[0])
}

// useNodeTerminal gives a process-level task a terminal of the node's
// (openNodeTerminal): the slave replaces the child's three descriptors,
// the master the stdout pipe's read end; the stderr pipe stays, its
// write end closed with the child's files, so the stderr stream ends
// empty.
func useNodeTerminal(s *taskSys, child *[3]*os.File, p *prepared) error {
	master, slave, err := openNodeTerminal(p)
	if err != nil {
		return err
	}
	for _, f := range child {
		f.Close()
	}
	s.stdoutR.Close()
	s.stdoutR = master
	*child = [3]*os.File{slave, slave, slave}
	return nil
}
