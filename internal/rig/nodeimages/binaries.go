package nodeimages

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"strings"
)

// buildBinaries builds the packages pkgs (relative to o.RepoRoot) into dir
// as the Dockerfile does: static (no cgo, the controller's and the pause
// image's bases have no C library), without local paths and symbols, for
// Linux on this machine's architecture.
func buildBinaries(ctx context.Context, o Options, dir string, pkgs []string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("creating the binaries' directory: %w", err)
	}
	fmt.Fprintf(o.Log, "go build %s\n", strings.Join(pkgs, " "))
	args := append([]string{"build", "-trimpath", "-ldflags=-s -w", "-o", dir + "/"}, pkgs...)
	// The go command needs the caller's environment (GOPATH, GOCACHE,
	// GOPROXY, GOFLAGS, HOME); only the target is set here.
	env := append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH="+runtime.GOARCH)
	if err := run(command(ctx, o.RepoRoot, env, o.Go, args...)); err != nil {
		return fmt.Errorf("building the binaries: %w", err)
	}
	return nil
}
