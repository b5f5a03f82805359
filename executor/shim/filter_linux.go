//go:build linux

package shim

import (
	"encoding/binary"
	"fmt"
	"unsafe"

	"golang.org/x/sys/unix"
)

// sockFilterSize is the size in bytes of the kernel's struct sock_filter:
// a 16-bit code, two 8-bit jump offsets and a 32-bit constant.
const sockFilterSize = 8

// maxFilterInsns is the kernel's limit on a classic BPF program's
// instructions (BPF_MAXINSNS, include/uapi/linux/bpf_common.h).
const maxFilterInsns = 4096

// EncodeFilter encodes a seccomp filter for [Config.SeccompFilter]: each
// instruction as the kernel's struct sock_filter, 8 bytes in the host's
// byte order (the agent and its shim run on one host). It returns an
// error for no instruction and for more than the kernel's BPF_MAXINSNS,
// which the shim would refuse.
func EncodeFilter(prog []unix.SockFilter) ([]byte, error) {
	if len(prog) == 0 || len(prog) > maxFilterInsns {
		return nil, fmt.Errorf("a seccomp filter of %d instructions: the kernel loads 1 to %d (BPF_MAXINSNS)", len(prog), maxFilterInsns)
	}
	out := make([]byte, 0, len(prog)*sockFilterSize)
	for _, in := range prog {
		out = binary.NativeEndian.AppendUint16(out, in.Code)
		out = append(out, in.Jt, in.Jf)
		out = binary.NativeEndian.AppendUint32(out, in.K)
	}
	return out, nil
}

// decodeFilter is [EncodeFilter]'s inverse. It returns an error for a
// length that is not a whole number of instructions, for no instruction,
// and for more than the kernel's BPF_MAXINSNS.
func decodeFilter(b []byte) ([]unix.SockFilter, error) {
	n := len(b) / sockFilterSize
	switch {
	case len(b)%sockFilterSize != 0:
		return nil, fmt.Errorf("seccomp filter of %d bytes: not a whole number of %d-byte instructions", len(b), sockFilterSize)
	case n == 0:
		return nil, fmt.Errorf("empty seccomp filter")
	case n > maxFilterInsns:
		return nil, fmt.Errorf("seccomp filter of %d instructions: the kernel loads at most %d (BPF_MAXINSNS)", n, maxFilterInsns)
	}
	prog := make([]unix.SockFilter, n)
	for i := range prog {
		in := b[i*sockFilterSize:]
		prog[i] = unix.SockFilter{Code: binary.NativeEndian.Uint16(in), Jt: in[2], Jf: in[3], K: binary.NativeEndian.Uint32(in[4:])}
	}
	return prog, nil
}

// loadFilter installs prog on the calling thread with seccomp(2);
// no_new_privs, which an unprivileged filter requires, must be set.
func loadFilter(prog []unix.SockFilter) error {
	fprog := unix.SockFprog{Len: uint16(len(prog)), Filter: &prog[0]}
	if _, _, e := unix.Syscall(unix.SYS_SECCOMP, unix.SECCOMP_SET_MODE_FILTER, 0, uintptr(unsafe.Pointer(&fprog))); e != 0 {
		return fmt.Errorf("loading the seccomp filter of %d instructions: %w", len(prog), e)
	}
	return nil
}
