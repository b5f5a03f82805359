package executor

import (
	"errors"
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// openUpper opens the workspace's image root's upper directory below
// root, without following symbolic links or crossing mounts; nil when
// there is none, or when WorkspaceRootDir is not root's (a task's own
// directory of that name, archived as part of the tree).
func openUpper(root *os.File) (*os.File, error) {
	how := &unix.OpenHow{
		Flags:   unix.O_RDONLY | unix.O_DIRECTORY | unix.O_NOFOLLOW | unix.O_CLOEXEC,
		Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS | unix.RESOLVE_NO_XDEV,
	}
	dir, err := unix.Openat2(int(root.Fd()), WorkspaceRootDir, how)
	if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ENOTDIR) || errors.Is(err, unix.ELOOP) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("opening %s: %w", WorkspaceRootDir, err)
	}
	defer unix.Close(dir)
	var st unix.Stat_t
	if err := unix.Fstat(dir, &st); err != nil {
		return nil, fmt.Errorf("stat of %s: %w", WorkspaceRootDir, err)
	}
	if st.Uid != 0 {
		return nil, nil
	}
	fd, err := unix.Openat2(dir, "upper", how)
	if errors.Is(err, unix.ENOENT) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("opening %s/upper: %w", WorkspaceRootDir, err)
	}
	return os.NewFile(uintptr(fd), WorkspaceRootDir+"/upper"), nil
}
