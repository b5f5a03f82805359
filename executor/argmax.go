package executor

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
)

const (
	// ArgMax is the kernel's smallest limit on the arguments and
	// environment of execve together: ARG_MAX, 32 pages of 4096 bytes
	// (include/uapi/linux/limits.h). The limit in force is larger with a
	// larger stack size limit; see [ArgEnvLimit].
	ArgMax = 32 * 4096
	// stkLim is the kernel's _STK_LIM, 8 MiB: execve never allows the
	// strings more than three quarters of it.
	stkLim = 8 << 20
	// ptrSize is the size of one argv or envp pointer on the new stack.
	ptrSize = 8
)

// ArgEnvLimit is the kernel's limit on the bytes execve copies for the
// arguments and environment (fs/exec.c, bprm_stack_limits): a quarter of the
// stack size limit stack (RLIMIT_STACK; negative means unlimited), at most
// three quarters of 8 MiB and at least [ArgMax]. The bytes are every string
// with its NUL (the program's path, each argument, each NAME=VALUE) and a
// pointer of 8 bytes per argument and environment entry.
func ArgEnvLimit(stack int64) int64 {
	limit := int64(stkLim / 4 * 3)
	if stack >= 0 {
		limit = min(limit, stack/4)
	}
	return max(limit, ArgMax)
}

// argEnvSize is what execve counts against [ArgEnvLimit] for path, argv and
// env.
func argEnvSize(path string, argv, env []string) int64 {
	n := int64(len(path)+1) + int64(max(len(argv), 1)+len(env))*ptrSize
	for _, s := range argv {
		n += int64(len(s) + 1)
	}
	for _, s := range env {
		n += int64(len(s) + 1)
	}
	return n
}

// argEnvMessage says how large the arguments and environment are, against
// the limit, and names the largest environment entries, so the message
// points at what to shrink.
func argEnvMessage(path string, argv, env []string, stack int64) string {
	size, limit := argEnvSize(path, argv, env), ArgEnvLimit(stack)
	var b strings.Builder
	fmt.Fprintf(&b, "environment and arguments total %d bytes (%d environment entries, a command of %d bytes), ",
		size, len(env), len(argv[len(argv)-1]))
	if size > limit {
		fmt.Fprintf(&b, "over the kernel's limit of %d bytes (ARG_MAX", limit)
	} else {
		fmt.Fprintf(&b, "refused by the kernel near its limit of %d bytes (ARG_MAX", limit)
	}
	if stack >= 0 {
		fmt.Fprintf(&b, ": a quarter of the stack size limit of %d bytes, between %d and %d", stack, ArgMax, stkLim/4*3)
	}
	b.WriteString(")")
	largest := slices.SortedStableFunc(slices.Values(env), func(a, b string) int { return cmp.Compare(len(b), len(a)) })
	if len(largest) > 3 {
		largest = largest[:3]
	}
	for i, e := range largest {
		name, _, _ := strings.Cut(e, "=")
		if i == 0 {
			b.WriteString("; the largest entries: ")
		} else {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "%s (%d bytes)", name, len(e))
	}
	return b.String()
}

// CurrentArgEnvLimit is [ArgEnvLimit] for the stack size limit this process
// passes on to the tasks it starts (its RLIMIT_STACK soft limit); without
// one (unlimited, or not Linux) it is the ceiling of three quarters of
// 8 MiB. The agent reports it to the controller, which refuses a task over
// it before sending it.
func CurrentArgEnvLimit() int64 { return ArgEnvLimit(stackLimit()) }
