//go:build !linux

package executor

// egress exists only on Linux.
type egress struct{ resolvPath string }

func newEgress(*egressPlan) (*egress, error) { return nil, ErrUnsupported }

func (*egress) close() error { return nil }
