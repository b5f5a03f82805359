// Package registry runs an OCI registry on the machine, for the machine:
// go-containerregistry's registry (pkg/registry) on a loopback port, with
// its blobs in a directory and its manifests recorded beside them, so that
// a registry started again on the same directory serves what was pushed
// before. Tests, bashtask-local and the benchmarks push the images built
// here (internal/rig/nodeimages) to it and name them as
// 127.0.0.1:PORT/REPOSITORY:TAG; the agent pulls from it over plain HTTP
// (loopback addresses are plain HTTP for go-containerregistry without
// being listed; docs/images.md, "Images on the machine").
//
// It has no authentication and no TLS: it is for one machine's own use.
package registry

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	ggcr "github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// DefaultAddr is the address Start listens on when Options.Addr is empty:
// a free port of the IPv4 loopback.
const DefaultAddr = "127.0.0.1:0"

// Options configure Start.
type Options struct {
	// Dir holds the blobs (Dir/blobs/sha256/HEX) and the manifests' records
	// (Dir/manifests); it is made when missing. Required.
	Dir string
	// Addr is the TCP address to listen on; empty means DefaultAddr. It
	// must be a loopback address unless AnyHost is set: the registry has
	// no authentication.
	Addr string
	// AnyHost lets Addr name any host (":5000" listens on every address):
	// for a registry inside a one-node cluster's pod, whose network only
	// that node reaches (internal/rig/nodecluster).
	AnyHost bool
	// Wrap, when set, wraps the registry's handler (GuardPrivateForTest,
	// for repositories that want credentials).
	Wrap func(http.Handler) http.Handler
	// Log receives one line per request; nil discards them.
	Log io.Writer
}

// Registry is a running registry.
type Registry struct {
	host string
	dir  string
	srv  *http.Server
	done chan error
}

// Start starts a registry on o.Dir, serving the manifests recorded there
// by an earlier registry on the same directory, and returns once it
// listens. Errors name the directory or the address.
func Start(o Options) (*Registry, error) {
	if o.Dir == "" {
		return nil, errors.New("registry: Options.Dir is required")
	}
	addr := cmp.Or(o.Addr, DefaultAddr)
	if !o.AnyHost {
		if err := checkLoopback(addr); err != nil {
			return nil, err
		}
	}
	for _, d := range []string{blobDir(o.Dir), manifestDir(o.Dir)} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, fmt.Errorf("registry: creating %s: %w", d, err)
		}
	}
	logger := log.New(cmp.Or[io.Writer](o.Log, io.Discard), "registry: ", log.LstdFlags)
	inner := ggcr.New(ggcr.Logger(logger), ggcr.WithBlobHandler(newBlobHandler(blobDir(o.Dir))))
	if err := replayManifests(o.Dir, inner); err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("registry: listening on %s: %w", addr, err)
	}
	handler := recordManifests(o.Dir, inner)
	if o.Wrap != nil {
		handler = o.Wrap(handler)
	}
	r := &Registry{
		host: ln.Addr().String(),
		dir:  o.Dir,
		srv:  &http.Server{Handler: handler, ReadHeaderTimeout: 30 * time.Second},
		done: make(chan error, 1),
	}
	go func() { r.done <- r.srv.Serve(ln) }()
	return r, nil
}

// checkLoopback refuses an address whose host is not a loopback IP or
// "localhost".
func checkLoopback(addr string) error {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("registry: address %q: %w", addr, err)
	}
	if host == "localhost" {
		return nil
	}
	if ip := net.ParseIP(host); ip == nil || !ip.IsLoopback() {
		return fmt.Errorf("registry: address %q: the host must be a loopback address (the registry has no authentication)", addr)
	}
	return nil
}

// Host is the registry's host and port, e.g. 127.0.0.1:41234: the first
// element of the references of its images.
func (r *Registry) Host() string { return r.host }

// Dir is the registry's directory (Options.Dir).
func (r *Registry) Dir() string { return r.dir }

// Ref is the reference of repo:tag in this registry, e.g.
// 127.0.0.1:41234/bashtask/task-small:dev.
func (r *Registry) Ref(repo, tag string) string { return r.host + "/" + repo + ":" + tag }

// Wait blocks until the registry stops serving, and returns why; a
// registry stopped by Close returns nil.
func (r *Registry) Wait() error {
	err := <-r.done
	r.done <- err
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return err
}

// Close stops the registry, waiting up to 10 seconds for requests under
// way. The directory stays.
func (r *Registry) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err := r.srv.Shutdown(ctx)
	if serr := <-r.done; !errors.Is(serr, http.ErrServerClosed) {
		err = errors.Join(err, serr)
	}
	return err
}

// Push writes img to repo:tag in the registry (remote.Write) and returns
// its reference by digest, repo@sha256:..., which names the same image
// whatever the tag names later. repo is a path such as "bashtask/task".
func (r *Registry) Push(ctx context.Context, img v1.Image, repo, tag string) (name.Digest, error) {
	ref, err := name.NewTag(r.Ref(repo, tag), name.StrictValidation)
	if err != nil {
		return name.Digest{}, fmt.Errorf("registry: reference %s:%s: %w", repo, tag, err)
	}
	if err := remote.Write(ref, img, remote.WithContext(ctx)); err != nil {
		return name.Digest{}, fmt.Errorf("registry: pushing %s: %w", ref, err)
	}
	d, err := img.Digest()
	if err != nil {
		return name.Digest{}, fmt.Errorf("registry: digest of %s: %w", ref, err)
	}
	return ref.Context().Digest(d.String()), nil
}

// PushArchive pushes the image of the docker-archive tar file archive
// (as internal/rig/nodeimages writes them) under ref's repository path
// and tag, with ref's registry host replaced by this registry's:
// localhost/bashtask/task-small:dev goes to HOST/bashtask/task-small:dev.
// It returns the reference by digest.
func (r *Registry) PushArchive(ctx context.Context, archive, ref string) (name.Digest, error) {
	tag, err := name.NewTag(ref, name.StrictValidation)
	if err != nil {
		return name.Digest{}, fmt.Errorf("registry: reference %q: %w", ref, err)
	}
	img, err := tarball.ImageFromPath(archive, &tag)
	if err != nil {
		return name.Digest{}, fmt.Errorf("registry: reading %s from %s: %w", ref, archive, err)
	}
	return r.Push(ctx, img, tag.RepositoryStr(), tag.TagStr())
}

// blobDir holds the blobs of the registry on dir.
func blobDir(dir string) string { return filepath.Join(dir, "blobs") }

// manifestDir holds the manifests' records of the registry on dir.
func manifestDir(dir string) string { return filepath.Join(dir, "manifests") }

// isManifestPath reports whether p is /v2/NAME/manifests/REFERENCE, and
// returns NAME and REFERENCE.
func isManifestPath(p string) (repo, ref string, ok bool) {
	rest, ok := strings.CutPrefix(p, "/v2/")
	if !ok {
		return "", "", false
	}
	i := strings.LastIndex(rest, "/manifests/")
	if i <= 0 {
		return "", "", false
	}
	return rest[:i], rest[i+len("/manifests/"):], rest[i+len("/manifests/"):] != ""
}
