package main

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/bashtask/bashtask-operator/internal/rig/nodeimages"
	"github.com/bashtask/bashtask-operator/internal/rig/testutil"
)

// TestStartRegistry builds task-small, pushes it to a registry in the
// cluster's directory and finds it there by the printed reference.
func TestStartRegistry(t *testing.T) {
	for _, f := range []string{nodeimages.HostBashStatic, nodeimages.HostBusybox} {
		if _, err := os.Stat(f); err != nil {
			testutil.SkipUnlessStrictf(t, "%s is missing (make test-packages): %v", f, err)
		}
	}
	dir, binDir := t.TempDir(), t.TempDir()
	reg, pushed, err := startRegistry(context.Background(), registryOptions{on: true, addr: "127.0.0.1:0", images: []string{"task-small"}}, dir, binDir, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	defer reg.Close()
	if len(pushed) != 1 || pushed[0].ref != reg.Host()+"/bashtask/task-small:local" {
		t.Fatalf("pushed %+v, want %s/bashtask/task-small:local", pushed, reg.Host())
	}
	ref, err := name.ParseReference(pushed[0].ref)
	if err != nil {
		t.Fatal(err)
	}
	img, err := remote.Image(ref)
	if err != nil {
		t.Fatalf("pulling %s: %v", ref, err)
	}
	if d, _ := img.Digest(); !strings.HasSuffix(pushed[0].digest, "@"+d.String()) {
		t.Errorf("digest %s, printed %s", d, pushed[0].digest)
	}
	if _, err := os.Stat(filepath.Join(dir, "registry", "blobs")); err != nil {
		t.Errorf("the registry's blobs are not in the cluster's directory: %v", err)
	}

	_, _, err = startRegistry(context.Background(), registryOptions{images: []string{"agent"}}, dir, binDir, io.Discard)
	if err == nil || !strings.Contains(err.Error(), `--registry-image "agent"`) {
		t.Errorf("an image that is not a task image: %v, want an error naming the flag", err)
	}
}

// TestRegistryAgentArgs passes --insecure-registry only to an agent that
// has the flag.
func TestRegistryAgentArgs(t *testing.T) {
	bin := t.TempDir()
	agent := filepath.Join(bin, "bashtask-agent")
	if err := os.WriteFile(agent, []byte("#!/bin/sh\necho '      --task-network string'\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if got := registryAgentArgs(context.Background(), bin, "127.0.0.1:5000"); got != nil {
		t.Errorf("without the flag: %q, want none", got)
	}
	if err := os.WriteFile(agent, []byte("#!/bin/sh\necho '      --insecure-registry stringArray'\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if got := registryAgentArgs(context.Background(), bin, "127.0.0.1:5000"); !slices.Equal(got, []string{"--insecure-registry=127.0.0.1:5000"}) {
		t.Errorf("with the flag: %q", got)
	}
}
