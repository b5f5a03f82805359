package testrig

import (
	"fmt"
	"os"

	"github.com/bashtask/bashtask-operator/executor"
	"github.com/bashtask/bashtask-operator/executor/agent"
	"github.com/bashtask/bashtask-operator/internal/rig/testshim"
)

// tenantUIDsPerAgent is how many task UIDs each agent of a tenant-level
// rig leases from.
const tenantUIDsPerAgent = 512

// tenantLevel is what agents at the tenant level of one rig share: the
// shim binary, and the base of their UID ranges and cgroup parents, which
// keep them apart from each other and from other test processes.
type tenantLevel struct {
	shim         string
	firstUID     uint32
	cgroupPrefix string
	diskBytes    int64
}

// newTenantLevel builds the shim (testshim) and picks the rig's UID
// ranges: from 3000000, in one of 1000 slots chosen by the process ID, so
// two test processes on one host rarely share one (localcluster's agents
// lease from 2000000 up to about 1.03e9 in slots of their own).
func newTenantLevel(diskBytes int64) (*tenantLevel, error) {
	if os.Geteuid() != 0 {
		return nil, fmt.Errorf("a rig at the tenant level runs as root (euid %d)", os.Geteuid())
	}
	if err := testshim.Prepare(); err != nil {
		return nil, fmt.Errorf("building bashtask-shim: %w", err)
	}
	shim, err := testshim.Built()
	if err != nil {
		return nil, err
	}
	pid := os.Getpid()
	return &tenantLevel{
		shim:         shim,
		firstUID:     uint32(3000000 + (pid%1000)*8*tenantUIDsPerAgent),
		cgroupPrefix: fmt.Sprintf("bashtask-rig-%d", pid),
		diskBytes:    diskBytes,
	}, nil
}

// configure sets the tenant level on the index-th agent's configuration,
// with its working directories and workspaces under dir.
func (t *tenantLevel) configure(cfg *agent.Config, index int, dir string) error {
	first := t.firstUID + uint32(index)*tenantUIDsPerAgent
	cfg.TaskUIDs = agent.UIDRange{First: first, Last: first + tenantUIDsPerAgent - 1}
	cfg.Executor.Isolation = executor.IsolationTenant
	cfg.Executor.ShimPath = t.shim
	cfg.Executor.CgroupParent = fmt.Sprintf("%s-%s", t.cgroupPrefix, cfg.NodeName)
	// Task directories and workspaces in the rig's directory, not the
	// host's temporary one: what a failed test leaves stays in the rig.
	cfg.Executor.WorkDirRoot = dir
	if t.diskBytes > 0 {
		cfg.Executor.DiskQuotaBytes = t.diskBytes
		cfg.Executor.DiskQuotaCapBytes = 4 * t.diskBytes
		cfg.Executor.DiskImageDir = dir + "-images"
		if err := os.MkdirAll(cfg.Executor.DiskImageDir, 0o700); err != nil {
			return err
		}
	}
	return os.MkdirAll(dir, 0o755)
}
