//go:build linux

package executor

import (
	"fmt"
	"os"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/bashtask/bashtask-operator/executor/shim"
)

// idmaps are the user namespaces of the image roots' idmapped layers
// (docs/images.md, "Who owns the image's files"), one per task UID and
// GID: each maps 0 to the UID and the GID and nothing else, so that the
// image's root-owned files are the task's in its root. A namespace is
// made once per UID and GID pair and kept, an open descriptor, until the
// executor closes: a few hundred bytes of the kernel's each, at most one
// per UID the agent hands out.
type idmaps struct {
	mu  sync.Mutex
	fds map[[2]uint32]int
}

// get returns the namespace of uid and gid, making it with shimPath when
// there is none yet. The descriptor stays the cache's.
func (m *idmaps) get(shimPath string, uid, gid uint32) (int, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	key := [2]uint32{uid, gid}
	if fd, ok := m.fds[key]; ok {
		return fd, nil
	}
	fd, err := newIDMapNS(shimPath, uid, gid)
	if err != nil {
		return -1, err
	}
	if m.fds == nil {
		m.fds = map[[2]uint32]int{}
	}
	m.fds[key] = fd
	return fd, nil
}

// close closes every namespace's descriptor.
func (m *idmaps) close() {
	m.mu.Lock()
	defer m.mu.Unlock()
	for k, fd := range m.fds {
		unix.Close(fd)
		delete(m.fds, k)
	}
}

// newIDMapNS makes a user namespace mapping 0 to uid and gid: a shim
// process (the one binary at hand that waits without doing anything)
// cloned into a new user namespace with those maps, which Go's fork
// writes before the exec; its namespace is opened while it waits for a
// Config, then its config socket closes and it exits.
func newIDMapNS(shimPath string, uid, gid uint32) (int, error) {
	pair, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return -1, err
	}
	own, child := os.NewFile(uintptr(pair[0]), "config"), os.NewFile(uintptr(pair[1]), "config")
	defer own.Close()
	defer child.Close()
	devNull, err := os.OpenFile(os.DevNull, os.O_RDWR, 0)
	if err != nil {
		return -1, err
	}
	defer devNull.Close()
	sys := &syscall.SysProcAttr{
		Cloneflags:  unix.CLONE_NEWUSER,
		UidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: int(uid), Size: 1}},
		GidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: int(gid), Size: 1}},
	}
	attr := &os.ProcAttr{Dir: "/", Env: []string{"GOMAXPROCS=1"}, Files: []*os.File{devNull, devNull, devNull, child, devNull}, Sys: sys}
	proc, _, exitCh, err := startWaited(func(pidfd *int) (*os.Process, error) {
		sys.PidFD = pidfd
		return os.StartProcess(shimPath, []string{shim.Arg0}, attr)
	})
	if err != nil {
		return -1, fmt.Errorf("starting a process in a user namespace for the image's idmapped layers: %w", err)
	}
	fd, err := unix.Open(fmt.Sprintf("/proc/%d/ns/user", proc.Pid), unix.O_RDONLY|unix.O_CLOEXEC, 0)
	own.Close() // the process reads an empty Config and exits
	if err != nil {
		_ = proc.Kill()
	}
	<-exitCh
	if err != nil {
		return -1, fmt.Errorf("opening the user namespace of the image's idmapped layers: %w", err)
	}
	return fd, nil
}
