package main

import (
	"errors"
	"fmt"
	"hash/fnv"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/bashtask/bashtask-operator/executor"
)

// networks resolves --task-network and --allowed-networks for isolation:
// at the tenant level the default network is egress and the default
// allowed ones egress and none (node, which reaches whatever this pod
// reaches, is an explicit opt-in); at the process level only node exists.
func (o *serveOptions) networks(isolation executor.Isolation) (executor.Network, []executor.Network, error) {
	tenant := isolation == executor.IsolationTenant
	var allowed []executor.Network
	for _, name := range o.allowedNetworks {
		n, err := executor.ParseNetwork(strings.ToLower(strings.TrimSpace(name)))
		if err != nil || name == "" {
			return "", nil, fmt.Errorf("--allowed-networks %q: want node, none or egress", name)
		}
		if !slices.Contains(allowed, n) {
			allowed = append(allowed, n)
		}
	}
	switch {
	case len(allowed) == 0 && tenant:
		allowed = []executor.Network{executor.NetworkEgress, executor.NetworkNone}
	case len(allowed) == 0:
		allowed = []executor.Network{executor.NetworkNode}
	case !tenant && !slices.Equal(allowed, []executor.Network{executor.NetworkNode}):
		return "", nil, fmt.Errorf("--allowed-networks=%s: at --isolation=process only node exists (none and egress need --isolation=tenant)", strings.Join(o.allowedNetworks, ","))
	}
	network := executor.Network(strings.ToLower(o.taskNetwork))
	if network == "" {
		network = allowed[0]
		if tenant && slices.Contains(allowed, executor.NetworkEgress) {
			network = executor.NetworkEgress
		}
	}
	if _, err := executor.ParseNetwork(string(network)); err != nil {
		return "", nil, fmt.Errorf("--task-network: %w", err)
	}
	if !slices.Contains(allowed, network) {
		names := make([]string, len(allowed))
		for i, n := range allowed {
			names[i] = string(n)
		}
		return "", nil, fmt.Errorf("--task-network=%s is not one of --allowed-networks %s", network, strings.Join(names, ","))
	}
	return network, allowed, nil
}

// systemResolvConf lists this pod's resolvers; systemdResolvConf lists
// systemd-resolved's upstream servers where /etc/resolv.conf names only its
// stub (127.0.0.53), which a task's network namespace cannot reach.
const (
	systemResolvConf  = "/etc/resolv.conf"
	systemdResolvConf = "/run/systemd/resolve/resolv.conf"
)

// egressConfig builds the executor's egress configuration from the flags.
// Its ID is derived from the state directory: stable across restarts of
// this agent (its recovery removes what an earlier run left) and apart
// from another agent's on the same host, which has a state directory of
// its own.
func (o *serveOptions) egressConfig() (*executor.EgressConfig, error) {
	dir, err := filepath.Abs(o.stateDir)
	if err != nil {
		return nil, err
	}
	h := fnv.New32a()
	_, _ = h.Write([]byte(dir))
	cfg := &executor.EgressConfig{
		ID:   fmt.Sprintf("%06x", h.Sum32()&0xffffff),
		CIDR: o.egressCIDR,
		Deny: o.egressDeny,
	}
	own, err := os.ReadFile(systemResolvConf)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("reading %s: %w", systemResolvConf, err)
	}
	rc := executor.ParseResolvConf(own)
	cfg.Search, cfg.Options = rc.Search, rc.Options
	cfg.Resolvers = o.egressResolvers
	if len(cfg.Resolvers) == 0 {
		cfg.Resolvers = reachableResolvers(rc.Nameservers)
		if len(cfg.Resolvers) == 0 {
			if up, err := os.ReadFile(systemdResolvConf); err == nil {
				cfg.Resolvers = reachableResolvers(executor.ParseResolvConf(up).Nameservers)
			}
		}
	}
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("--egress-*: %w", err)
	}
	return cfg, nil
}

// reachableResolvers keeps the IPv4 nameservers other than loopback ones.
func reachableResolvers(servers []string) []string {
	var out []string
	for _, s := range servers {
		if a, err := netip.ParseAddr(s); err == nil && a.Is4() && !a.IsLoopback() {
			out = append(out, a.String())
		}
	}
	return out
}
