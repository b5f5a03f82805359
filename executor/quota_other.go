//go:build !linux

package executor

// quotaFS exists only on Linux.
type quotaFS struct{ dir string }

func (*quotaFS) remove() error { return nil }

func (*quotaFS) retire() error { return nil }

// diskQuota exists only on Linux.
type diskQuota struct{}

func (*diskQuota) close() {}

// DefaultDiskQuotaInodes and MinDiskQuotaBytes: see the Linux build.
const (
	DefaultDiskQuotaInodes = 1 << 20
	MinDiskQuotaBytes      = 32 << 20
)

func (*diskQuota) take(int64) (*quotaFS, error) { return nil, ErrUnsupported }

func (e *Executor) setupDiskQuota(cfg Config) error {
	if cfg.DiskQuotaBytes != 0 {
		e.quotaWanted, e.quotaCap = true, max(cfg.DiskQuotaCapBytes, cfg.DiskQuotaBytes)
	}
	return nil
}

// SweepDiskImages needs Linux.
func SweepDiskImages(string) error { return nil }
