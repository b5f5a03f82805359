package main

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/bashtask/bashtask-operator/executor"
)

// The tenant level defaults to network egress and allows egress and none;
// node is an opt-in there and the only network of the process level.
func TestNetworkFlags(t *testing.T) {
	for name, tc := range map[string]struct {
		isolation    executor.Isolation
		task         string
		allowed      []string
		wantNet      executor.Network
		wantAllowed  []executor.Network
		wantErrField string
	}{
		"tenant defaults":     {isolation: executor.IsolationTenant, wantNet: executor.NetworkEgress, wantAllowed: []executor.Network{executor.NetworkEgress, executor.NetworkNone}},
		"process defaults":    {isolation: executor.IsolationProcess, wantNet: executor.NetworkNode, wantAllowed: []executor.Network{executor.NetworkNode}},
		"tenant opts in node": {isolation: executor.IsolationTenant, task: "node", allowed: []string{"node", "egress"}, wantNet: executor.NetworkNode, wantAllowed: []executor.Network{executor.NetworkNode, executor.NetworkEgress}},
		"tenant none only":    {isolation: executor.IsolationTenant, allowed: []string{"none"}, wantNet: executor.NetworkNone, wantAllowed: []executor.Network{executor.NetworkNone}},
		"node not allowed":    {isolation: executor.IsolationTenant, task: "node", wantErrField: "--task-network=node is not one of --allowed-networks egress,none"},
		"egress on process":   {isolation: executor.IsolationProcess, allowed: []string{"egress"}, wantErrField: "at --isolation=process only node exists"},
		"unknown allowed":     {isolation: executor.IsolationTenant, allowed: []string{"host"}, wantErrField: `--allowed-networks "host"`},
		"unknown default":     {isolation: executor.IsolationTenant, task: "host", wantErrField: "--task-network"},
	} {
		t.Run(name, func(t *testing.T) {
			o := &serveOptions{taskNetwork: tc.task, allowedNetworks: tc.allowed}
			net, allowed, err := o.networks(tc.isolation)
			if tc.wantErrField != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErrField) {
					t.Fatalf("networks: %v, want an error with %q", err, tc.wantErrField)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if net != tc.wantNet {
				t.Errorf("task network %q, want %q", net, tc.wantNet)
			}
			if d := cmp.Diff(tc.wantAllowed, allowed); d != "" {
				t.Errorf("allowed networks (-want +got):\n%s", d)
			}
		})
	}
}

// A loopback resolver, which no task's network namespace reaches, is
// refused at start naming the flag.
func TestServeRejectsLoopbackResolver(t *testing.T) {
	_, err := execute(t, "serve", "--state-dir", t.TempDir(), "--isolation=tenant", "--egress-resolver=127.0.0.53")
	if err == nil || !strings.Contains(err.Error(), "--egress-*") || !strings.Contains(err.Error(), "resolver 127.0.0.53 is a loopback address") {
		t.Errorf("serve --egress-resolver=127.0.0.53: %v, want the loopback refusal", err)
	}
}
