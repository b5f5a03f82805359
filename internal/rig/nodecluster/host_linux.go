package nodecluster

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/bashtask/bashtask-operator/internal/mounts"
	"github.com/bashtask/bashtask-operator/internal/procfs"
)

// hostState is what the host looked like before `up` changed it; `down`
// puts it back. It is kept in host.json so a `down` from another process
// (or after a failed `up`) undoes exactly what was done.
type hostState struct {
	// Sysctls maps each /proc/sys path kubelet, kube-proxy or the bridge
	// plugin may change to its value before.
	Sysctls map[string]string `json:"sysctls"`
	// NewPaths are the host directories that did not exist and that the
	// node's components create (kubelet's root, pod logs, CNI state, the
	// agent's hostPath state directory).
	NewPaths []string `json:"newPaths"`
	// NftTables are the nftables tables that existed ("family name").
	NftTables []string `json:"nftTables"`
	// AddedAddress is true when up added the node address to lo.
	AddedAddress bool `json:"addedAddress"`
}

// sysctlsTouched are the settings kubelet (with protectKernelDefaults
// false), kube-proxy and the bridge plugin set.
var sysctlsTouched = []string{
	"vm/overcommit_memory", "vm/panic_on_oom", "kernel/panic", "kernel/panic_on_oops",
	"kernel/keys/root_maxkeys", "kernel/keys/root_maxbytes",
	"net/ipv4/ip_forward", "net/ipv4/conf/all/route_localnet",
	"net/bridge/bridge-nf-call-iptables", "net/bridge/bridge-nf-call-ip6tables",
}

// hostPathsTouched are the host directories the node's components create.
var hostPathsTouched = []string{
	"/var/lib/kubelet", "/var/log/pods", "/var/log/containers", "/usr/libexec/kubernetes",
	"/var/lib/cni", "/var/lib/bashtask-agent", "/etc/kubernetes",
}

func (c *Cluster) hostStateFile() string { return filepath.Join(c.opts.Dir, "host.json") }

// recordHost saves the host's state before anything changes it.
func (c *Cluster) recordHost() (*hostState, error) {
	h := &hostState{Sysctls: map[string]string{}}
	for _, s := range sysctlsTouched {
		if b, err := os.ReadFile(filepath.Join("/proc/sys", s)); err == nil {
			h.Sysctls[s] = strings.TrimSpace(string(b))
		}
	}
	for _, p := range hostPathsTouched {
		if _, err := os.Lstat(p); errors.Is(err, fs.ErrNotExist) {
			h.NewPaths = append(h.NewPaths, p)
		}
	}
	tables, err := nftTables()
	if err != nil {
		return nil, err
	}
	h.NftTables = tables
	return h, c.saveHost(h)
}

func (c *Cluster) saveHost(h *hostState) error {
	b, err := json.MarshalIndent(h, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(c.hostStateFile(), b, 0o644)
}

func (c *Cluster) loadHost() (*hostState, error) {
	b, err := os.ReadFile(c.hostStateFile())
	if err != nil {
		return nil, err
	}
	h := &hostState{}
	if err := json.Unmarshal(b, h); err != nil {
		return nil, fmt.Errorf("reading %s: %w", c.hostStateFile(), err)
	}
	return h, nil
}

// addNodeAddress puts the node's address on lo. The API server, kubelet
// and kube-proxy bind to it: it is reachable from the pods (through the
// bridge's gateway) and from this host, and from nowhere else.
func (c *Cluster) addNodeAddress(h *hostState) error {
	out, err := exec.Command("ip", "-o", "addr", "show", "dev", "lo").CombinedOutput()
	if err != nil {
		return fmt.Errorf("ip addr show dev lo: %w: %s", err, out)
	}
	if strings.Contains(string(out), " "+c.opts.NodeIP+"/") {
		return nil
	}
	if out, err := exec.Command("ip", "addr", "add", c.opts.NodeIP+"/32", "dev", "lo").CombinedOutput(); err != nil {
		return fmt.Errorf("adding %s to lo: %w: %s", c.opts.NodeIP, err, out)
	}
	h.AddedAddress = true
	return c.saveHost(h)
}

// nftTables lists the host's nftables tables as "family name".
func nftTables() ([]string, error) {
	out, err := exec.Command("nft", "list", "tables").CombinedOutput()
	if err != nil {
		return nil, fmt.Errorf("nft list tables: %w: %s", err, out)
	}
	var tables []string
	for line := range strings.SplitSeq(string(out), "\n") {
		if t, ok := strings.CutPrefix(strings.TrimSpace(line), "table "); ok {
			tables = append(tables, t)
		}
	}
	return tables, nil
}

// restoreHost undoes what the node's components did to the host, in
// reverse order of how they did it. It goes on after an error and returns
// them all.
func (c *Cluster) restoreHost(h *hostState) error {
	var errs []error
	// Processes first: everything kubelet started lives in a kubepods
	// cgroup; the runtime's shims are found by their containerd address.
	killCgroupTrees("kubepods")
	killMatching(func(cmdline string) bool {
		return strings.Contains(cmdline, "containerd-shim") && strings.Contains(cmdline, c.ContainerdSocket())
	})
	if err := unmountUnder(append([]string{"/var/lib/kubelet", "/run/netns/cni-", c.opts.RunDir}, filepath.Join(c.opts.Dir, "containerd"))...); err != nil {
		errs = append(errs, err)
	}
	if ns, _ := filepath.Glob("/run/netns/cni-*"); len(ns) > 0 {
		for _, p := range ns {
			_ = os.Remove(p)
		}
	}
	if out, err := exec.Command("ip", "link", "show", c.opts.Bridge).CombinedOutput(); err == nil {
		if out, err := exec.Command("ip", "link", "delete", c.opts.Bridge).CombinedOutput(); err != nil {
			errs = append(errs, fmt.Errorf("deleting the bridge %s: %w: %s", c.opts.Bridge, err, out))
		}
	} else if !strings.Contains(string(out), "does not exist") {
		errs = append(errs, fmt.Errorf("ip link show %s: %w: %s", c.opts.Bridge, err, out))
	}
	if tables, err := nftTables(); err != nil {
		errs = append(errs, err)
	} else {
		for _, t := range tables {
			if slices.Contains(h.NftTables, t) {
				continue
			}
			args := append([]string{"delete", "table"}, strings.Fields(t)...)
			if out, err := exec.Command("nft", args...).CombinedOutput(); err != nil {
				errs = append(errs, fmt.Errorf("nft delete table %s: %w: %s", t, err, out))
			}
		}
	}
	if err := removeCgroupTrees("kubepods"); err != nil {
		errs = append(errs, err)
	}
	// Sorted for a stable order; a setting that cannot be written back
	// (a read-only one) is reported, not fatal.
	keys := make([]string, 0, len(h.Sysctls))
	for k := range h.Sysctls {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		p := filepath.Join("/proc/sys", k)
		if b, err := os.ReadFile(p); err == nil && strings.TrimSpace(string(b)) == h.Sysctls[k] {
			continue
		}
		if err := os.WriteFile(p, []byte(h.Sysctls[k]+"\n"), 0o644); err != nil {
			errs = append(errs, fmt.Errorf("restoring %s: %w", k, err))
		}
	}
	for _, p := range h.NewPaths {
		if err := os.RemoveAll(p); err != nil {
			errs = append(errs, fmt.Errorf("removing %s: %w", p, err))
		}
	}
	if h.AddedAddress {
		if out, err := exec.Command("ip", "addr", "del", c.opts.NodeIP+"/32", "dev", "lo").CombinedOutput(); err != nil && !strings.Contains(string(out), "Cannot assign") {
			errs = append(errs, fmt.Errorf("removing %s from lo: %w: %s", c.opts.NodeIP, err, out))
		}
	}
	return errors.Join(errs...)
}

// cgroupMounts lists the directories of every cgroup hierarchy mounted
// under /sys/fs/cgroup (each v1 controller and the v2 tree).
func cgroupMounts() []string {
	entries, err := os.ReadDir("/sys/fs/cgroup")
	if err != nil {
		return nil
	}
	var out []string
	for _, e := range entries {
		if e.IsDir() {
			out = append(out, filepath.Join("/sys/fs/cgroup", e.Name()))
		}
	}
	if _, err := os.Stat("/sys/fs/cgroup/cgroup.procs"); err == nil {
		out = append(out, "/sys/fs/cgroup")
	}
	return out
}

// killCgroupTrees sends SIGKILL to every process in the cgroup named name
// (at the top of each hierarchy) and below, until none is left or 10 s
// pass. Where the v2 tree has cgroup.kill it uses it.
func killCgroupTrees(name string) {
	deadline := time.Now().Add(10 * time.Second)
	for {
		left := 0
		for _, m := range cgroupMounts() {
			root := filepath.Join(m, name)
			_ = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
				if err != nil || !d.IsDir() {
					return nil
				}
				if err := os.WriteFile(filepath.Join(p, "cgroup.kill"), []byte("1"), 0o644); err == nil {
					return nil
				}
				for _, pid := range readPids(filepath.Join(p, "cgroup.procs")) {
					left++
					_ = syscall.Kill(pid, syscall.SIGKILL)
				}
				return nil
			})
		}
		if left == 0 || time.Now().After(deadline) {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func readPids(path string) []int {
	f, err := os.Open(path)
	if err != nil {
		return nil
	}
	defer f.Close()
	var pids []int
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if pid, err := strconv.Atoi(strings.TrimSpace(sc.Text())); err == nil {
			pids = append(pids, pid)
		}
	}
	return pids
}

// removeCgroupTrees removes the cgroup named name at the top of each
// hierarchy, children first (rmdir(2) only removes an empty cgroup).
func removeCgroupTrees(name string) error {
	var errs []error
	for _, m := range cgroupMounts() {
		root := filepath.Join(m, name)
		var dirs []string
		_ = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				dirs = append(dirs, p)
			}
			return nil
		})
		// Deepest first.
		sort.Slice(dirs, func(i, j int) bool { return strings.Count(dirs[i], "/") > strings.Count(dirs[j], "/") })
		for _, d := range dirs {
			var err error
			for i := 0; i < 50; i++ {
				if err = syscall.Rmdir(d); err == nil || errors.Is(err, syscall.ENOENT) {
					err = nil
					break
				}
				time.Sleep(100 * time.Millisecond)
			}
			if err != nil {
				errs = append(errs, fmt.Errorf("removing cgroup %s: %w", d, err))
			}
		}
	}
	return errors.Join(errs...)
}

// killMatching sends SIGKILL to every process whose command line (NULs as
// spaces) matches.
func killMatching(match func(cmdline string) bool) {
	for _, pid := range procfs.PIDs() {
		b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "cmdline"))
		if err != nil || len(b) == 0 {
			continue
		}
		if match(strings.ReplaceAll(string(b), "\x00", " ")) {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
}

// unmountUnder detaches every mount whose mount point is at or below one
// of the prefixes, deepest first; a prefix that ends in "-" also matches
// the names that start with it (/run/netns/cni-).
func unmountUnder(prefixes ...string) error {
	return mounts.UnmountWhere(func(p string) bool {
		for _, pre := range prefixes {
			if mounts.Under(p, pre) || (strings.HasSuffix(pre, "-") && strings.HasPrefix(p, pre)) {
				return true
			}
		}
		return false
	})
}
