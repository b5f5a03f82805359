package executor

import "golang.org/x/sys/unix"

// stackLimit is the stack size limit a child inherits (RLIMIT_STACK's soft
// limit), -1 when unlimited or unknown.
func stackLimit() int64 {
	var r unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_STACK, &r); err != nil || r.Cur == unix.RLIM_INFINITY {
		return -1
	}
	return int64(r.Cur)
}
