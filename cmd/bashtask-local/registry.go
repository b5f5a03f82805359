package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"

	"github.com/bashtask/bashtask-operator/internal/rig/nodeimages"
	"github.com/bashtask/bashtask-operator/internal/rig/registry"
)

// registryTag is the tag of the task images bashtask-local pushes.
const registryTag = "local"

// registryOptions are the --registry flags of `up`.
type registryOptions struct {
	// on starts the registry.
	on bool
	// addr is its loopback address; port 0 picks a free one.
	addr string
	// images are the task images to build and push (task-small, task).
	images []string
}

// pushedImage is a task image in the local registry.
type pushedImage struct {
	ref, digest string
}

// startRegistry starts the registry on dir/registry, builds the task
// images o names (their archives, and the Debian tree's cache, in
// binDir/images, shared with `make images`) and pushes them. It returns
// the registry and the images' references; the caller closes the
// registry. log receives the build's lines.
func startRegistry(ctx context.Context, o registryOptions, dir, binDir string, log io.Writer) (*registry.Registry, []pushedImage, error) {
	var kinds []nodeimages.Kind
	for _, name := range o.images {
		k := nodeimages.Kind(strings.TrimSpace(name))
		if !slices.Contains(nodeimages.TaskKinds(), k) {
			return nil, nil, fmt.Errorf("--registry-image %q: want one of %v", name, nodeimages.TaskKinds())
		}
		kinds = append(kinds, k)
	}
	built, err := nodeimages.Build(ctx, nodeimages.Options{
		RepoRoot: ".", OutDir: filepath.Join(binDir, "images"), Tag: registryTag, Only: kinds, Log: log,
	})
	if err != nil {
		return nil, nil, fmt.Errorf("building the task images: %w", err)
	}
	reg, err := registry.Start(registry.Options{Dir: filepath.Join(dir, "registry"), Addr: o.addr})
	if err != nil {
		return nil, nil, err
	}
	var pushed []pushedImage
	for _, img := range built {
		d, err := reg.PushArchive(ctx, img.Archive, img.Ref)
		if err != nil {
			_ = reg.Close()
			return nil, nil, err
		}
		pushed = append(pushed, pushedImage{ref: reg.Ref(d.RepositoryStr(), registryTag), digest: d.String()})
	}
	return reg, pushed, nil
}

// registryAgentArgs are the agents' flags for the registry at host:
// --insecure-registry when the agent binary has it (a loopback registry is
// plain HTTP without it, go-containerregistry's rule; docs/images.md).
func registryAgentArgs(ctx context.Context, binDir, host string) []string {
	out, _ := exec.CommandContext(ctx, filepath.Join(binDir, "bashtask-agent"), "serve", "--help").CombinedOutput()
	if !bytes.Contains(out, []byte("--insecure-registry")) {
		return nil
	}
	return []string{"--insecure-registry=" + host}
}
