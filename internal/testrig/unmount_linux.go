package testrig

import "github.com/bashtask/bashtask-operator/internal/mounts"

// unmountUnder detaches every mount at or below dir, deepest first: the
// file systems of workspaces that the rig's agents made and that no
// deletion removed (an agent stopped by a test keeps its workspaces, as an
// agent restart must), so that the rig's directory can go and no loop
// device outlives the rig.
func unmountUnder(dir string) error {
	return mounts.UnmountWhere(func(p string) bool { return mounts.Under(p, dir) })
}
