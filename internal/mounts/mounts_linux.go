// Package mounts reads this process's mount table (/proc/self/mountinfo,
// proc(5)) and detaches mounts, for the code that cleans up after the
// mounts of others: a killed debootstrap, a kubelet, a container runtime.
package mounts

import (
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// Unescape undoes the octal escapes the kernel writes in mountinfo paths
// (\040 for a space, \011 tab, \012 newline, \134 backslash).
func Unescape(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// Points returns the mount points of /proc/self/mountinfo (field 5),
// unescaped, in the table's order; a point mounted twice is there twice.
// It returns the read error.
func Points() ([]string, error) {
	data, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil, fmt.Errorf("reading the mount table: %w", err)
	}
	var points []string
	for line := range strings.Lines(string(data)) {
		if f := strings.Fields(line); len(f) >= 5 {
			points = append(points, Unescape(f[4]))
		}
	}
	return points, nil
}

// UnmountWhere detaches (umount2 with MNT_DETACH) every mount whose point
// match accepts, deepest first, so that a mount on top of another goes
// first. A point no longer mounted (EINVAL, ENOENT) is not an error; the
// others are joined.
func UnmountWhere(match func(point string) bool) error {
	all, err := Points()
	if err != nil {
		return err
	}
	var points []string
	for _, p := range all {
		if match(p) {
			points = append(points, p)
		}
	}
	slices.SortStableFunc(points, func(a, b string) int { return len(b) - len(a) })
	var errs []error
	for _, p := range points {
		if err := unix.Unmount(p, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
			errs = append(errs, fmt.Errorf("unmounting %s: %w", p, err))
		}
	}
	return errors.Join(errs...)
}

// Under reports whether point is dir or below it.
func Under(point, dir string) bool {
	return point == dir || strings.HasPrefix(point, strings.TrimSuffix(dir, "/")+"/")
}

// UnmountUnder detaches every mount at or below dir, deepest first
// (UnmountWhere with Under).
func UnmountUnder(dir string) error {
	return UnmountWhere(func(p string) bool { return Under(p, dir) })
}
