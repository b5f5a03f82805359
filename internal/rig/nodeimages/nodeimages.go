package nodeimages

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// Kind names one of the images Build makes.
type Kind string

const (
	// Controller is bashtask-controller on an empty base (the Dockerfile's
	// controller target).
	Controller Kind = "controller"
	// Agent is bashtask-agent on Debian bookworm with the tools tasks
	// expect (the Dockerfile's agent target).
	Agent Kind = "agent"
	// Pause is the pod sandbox image: a process that holds the pod's
	// namespaces, reaps orphans and exits on SIGTERM or SIGINT.
	Pause Kind = "pause"
	// Registry is the one-node cluster's registry (internal/rig/registry
	// listening on every address of its pod) on an empty base; built only
	// when Options.Only names it.
	Registry Kind = "registry"
)

// Kinds returns the node's images, in the order Build makes them: what
// Build makes when Options.Only is empty. The task images (TaskKinds) are
// made only when Options.Only names them.
func Kinds() []Kind { return []Kind{Pause, Controller, Agent} }

// ReleaseKinds returns what a release builds and publishes: the node's
// images and the Task image, the chart's default image of tasks
// (agent.images.defaultImage; docs/install.md).
func ReleaseKinds() []Kind { return append(Kinds(), Task) }

// allKinds are the node's images, the registry, then the task images.
func allKinds() []Kind { return append(append(Kinds(), Registry), TaskKinds()...) }

// Defaults of Options.
const (
	// DefaultRepository prefixes the images' names. "localhost" marks them
	// as built here: no registry serves them, and Kubernetes must not try
	// to pull them (imagePullPolicy Never or IfNotPresent).
	DefaultRepository = "localhost/bashtask"
	// DefaultDebianMirror is where debootstrap fetches the agent's packages.
	DefaultDebianMirror = "http://deb.debian.org/debian"
)

// Options configure Build.
type Options struct {
	// RepoRoot is the directory of the module's go.mod, the directory the
	// binaries are built in; empty means the working directory.
	RepoRoot string
	// OutDir receives one archive per image and, under OutDir/cache, the
	// agent's root file system; empty means RepoRoot/bin/images.
	OutDir string
	// Repository prefixes each image's name (Repository/bashtask-agent);
	// empty means DefaultRepository.
	Repository string
	// Tag is the tag of every image; required, and not "latest": a pod
	// of a :latest image gets imagePullPolicy Always by default, and
	// there is no registry to pull from.
	Tag string
	// Version is the org.opencontainers.image.version label; empty means
	// "dev", as in the Dockerfile.
	Version string
	// Revision is the org.opencontainers.image.revision label (a commit);
	// empty means "unknown", as in the Dockerfile.
	Revision string
	// Created is the build time: the org.opencontainers.image.created
	// label (RFC 3339, UTC) and the images' creation time. Zero means the
	// label "unknown" and no creation time, as in the Dockerfile.
	Created time.Time
	// Only lists the images to build; empty means every kind of Kinds
	// (the task images are built only when listed).
	Only []Kind
	// DebianMirror is the Debian archive debootstrap uses for the agent's
	// root file system; empty means DefaultDebianMirror. It is part of the
	// cache key.
	DebianMirror string
	// Go is the go command that builds the binaries; empty means "go".
	Go string
	// Log receives one line per step; nil discards them.
	Log io.Writer
}

// Image is an image Build wrote.
type Image struct {
	// Kind is which image it is.
	Kind Kind
	// Ref is the image's name and tag, e.g.
	// localhost/bashtask/bashtask-agent:v0.3.0; the archive carries it, so
	// the image keeps it when imported.
	Ref string
	// Archive is the path of the docker-archive tar file holding the image,
	// for `ctr -n k8s.io images import ARCHIVE`.
	Archive string
}

// image describes one image: what the Dockerfile says about it.
type image struct {
	kind        Kind
	name        string // the repository's last element
	title       string
	description string
	// binary is the name `go build` gives the image's program, and path
	// where it goes in the image.
	binary, path string
	pkg          string // the program's package, relative to RepoRoot
	user         string
	entrypoint   []string
	cmd          []string
	// extra are the image's other programs, each its own layer after the
	// first program's, as a COPY line each in the Dockerfile.
	extra []program
}

// program is one more program of an image: the name `go build` gives it,
// its path in the image and its package, relative to RepoRoot.
type program struct {
	binary, path, pkg string
}

// images returns the description of every kind.
func images() map[Kind]image {
	return map[Kind]image{
		// The Dockerfile's distroless base adds /etc/passwd, /tmp, time
		// zones and CA certificates. The controller needs none of them: it
		// runs as a numeric user, writes no file, and dials only the API
		// server (in a pod with the service account's CA) and the agents
		// (with the CA of --tls-ca-file), so the image holds its binary
		// alone.
		Controller: {
			kind:        Controller,
			name:        "bashtask-controller",
			title:       "bashtask-controller",
			description: "Reconciles BashTask resources through the node agents",
			binary:      "bashtask-controller",
			path:        "/bashtask-controller",
			pkg:         "./cmd/bashtask-controller",
			user:        "65532:65532",
			entrypoint:  []string{"/bashtask-controller"},
		},
		// The agent runs as root, as in the Dockerfile: it creates the
		// tasks' cgroups and starts each task as the bashtask user.
		Agent: {
			kind:        Agent,
			name:        "bashtask-agent",
			title:       "bashtask-agent",
			description: "Node-local executor agent for BashTask resources",
			binary:      "bashtask-agent",
			path:        "/usr/local/bin/bashtask-agent",
			pkg:         "./cmd/bashtask-agent",
			entrypoint:  []string{"/usr/local/bin/bashtask-agent"},
			cmd:         []string{"serve"},
			// The agent starts it from beside its own binary as each
			// task's shim at the tenant isolation level.
			extra: []program{{binary: "bashtask-shim", path: "/usr/local/bin/bashtask-shim", pkg: "./cmd/bashtask-shim"}},
		},
		// Nothing but the program, as the controller's: the registry's
		// directory is the pod's volume.
		Registry: {
			kind:        Registry,
			name:        "registry",
			title:       "bashtask-registry",
			description: "OCI registry of the one-node test cluster (no authentication, no TLS)",
			binary:      "registry",
			path:        "/registry",
			pkg:         "./internal/rig/nodeimages/registry",
			user:        "65532:65532",
			entrypoint:  []string{"/registry"},
		},
		// The group is given too: the image has no /etc/group to look the
		// user's group up in. 65535 is the user of the upstream pause image.
		Pause: {
			kind:        Pause,
			name:        "pause",
			title:       "bashtask-pause",
			description: "Pod sandbox process: holds the pod's namespaces and reaps orphans",
			binary:      "pause",
			path:        "/pause",
			pkg:         "./internal/rig/nodeimages/pause",
			user:        "65535:65535",
			entrypoint:  []string{"/pause"},
		},
	}
}

// sourceURL is the org.opencontainers.image.source label.
const sourceURL = "https://github.com/bashtask/bashtask-operator"

// defaultPath is the images' PATH, the one of Debian's images.
const defaultPath = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// Build builds the images o asks for and writes each as a docker-archive
// tar file into o.OutDir, replacing an earlier archive of the same image.
// It returns the images in the order of Kinds. The agent's root file system
// is taken from the cache when there; otherwise making it needs root,
// debootstrap and the Debian mirror. Errors name the image and the step
// that failed; nothing is written for an image whose build failed.
func Build(ctx context.Context, o Options) ([]Image, error) {
	o, kinds, err := o.complete()
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(o.cacheDir(), 0o755); err != nil {
		return nil, fmt.Errorf("creating the output directory: %w", err)
	}
	work, err := os.MkdirTemp(o.OutDir, ".work-")
	if err != nil {
		return nil, fmt.Errorf("creating a work directory: %w", err)
	}
	defer os.RemoveAll(work)

	// The task images first: they need no binary, and the Debian one is
	// the step that needs root and the network.
	out, err := buildTaskImages(ctx, o, kinds, work)
	if err != nil {
		return nil, err
	}
	kinds = slices.DeleteFunc(kinds, func(k Kind) bool { return slices.Contains(TaskKinds(), k) })
	if len(kinds) == 0 {
		return out, nil
	}
	// The root file system first: it is the step that needs root and the
	// network, so it fails before the binaries are built.
	var rootFS string
	if slices.Contains(kinds, Agent) {
		if rootFS, err = agentRootFS(ctx, o); err != nil {
			return nil, fmt.Errorf("building the agent root file system: %w", err)
		}
	}
	specs := images()
	var pkgs []string
	for _, k := range kinds {
		pkgs = append(pkgs, specs[k].pkg)
		for _, p := range specs[k].extra {
			pkgs = append(pkgs, p.pkg)
		}
	}
	binDir := filepath.Join(work, "bin")
	if err := buildBinaries(ctx, o, binDir, pkgs); err != nil {
		return nil, err
	}
	var base map[Kind]string
	if rootFS != "" {
		base = map[Kind]string{Agent: rootFS}
	}
	node, err := writeImages(o, kinds, binDir, base, work)
	if err != nil {
		return nil, err
	}
	return append(node, out...), nil
}

// complete checks o and fills in its defaults; it returns the kinds to
// build in the order of Kinds.
func (o Options) complete() (Options, []Kind, error) {
	if o.Tag == "" {
		return o, nil, errors.New("a tag is required")
	}
	if o.Tag == name.DefaultTag {
		return o, nil, errors.New(`tag "latest" makes Kubernetes pull the images by default, and no registry has them; give another tag`)
	}
	var err error
	if o.RepoRoot, err = filepath.Abs(cmp.Or(o.RepoRoot, ".")); err != nil {
		return o, nil, fmt.Errorf("resolving the repository root: %w", err)
	}
	if o.OutDir == "" {
		o.OutDir = filepath.Join(o.RepoRoot, "bin", "images")
	}
	if o.OutDir, err = filepath.Abs(o.OutDir); err != nil {
		return o, nil, fmt.Errorf("resolving the output directory: %w", err)
	}
	o.Repository = cmp.Or(o.Repository, DefaultRepository)
	o.Version = cmp.Or(o.Version, "dev")
	o.Revision = cmp.Or(o.Revision, "unknown")
	o.DebianMirror = cmp.Or(o.DebianMirror, DefaultDebianMirror)
	o.Go = cmp.Or(o.Go, "go")
	if o.Log == nil {
		o.Log = io.Discard
	}
	for _, k := range o.Only {
		if !slices.Contains(allKinds(), k) {
			return o, nil, fmt.Errorf("unknown image %q: want one of %v", k, allKinds())
		}
	}
	var kinds []Kind
	for _, k := range allKinds() {
		if (len(o.Only) == 0 && slices.Contains(Kinds(), k)) || slices.Contains(o.Only, k) {
			kinds = append(kinds, k)
		}
	}
	for _, k := range kinds {
		if _, err := o.tag(spec(k)); err != nil {
			return o, nil, err
		}
	}
	return o, kinds, nil
}

// cacheDir holds what outlives a build: the agent's root file system.
func (o Options) cacheDir() string { return filepath.Join(o.OutDir, "cache") }

// tag is the reference of img.
func (o Options) tag(img image) (name.Tag, error) {
	ref := fmt.Sprintf("%s/%s:%s", o.Repository, img.name, o.Tag)
	t, err := name.NewTag(ref, name.StrictValidation)
	if err != nil {
		return name.Tag{}, fmt.Errorf("image reference %q: %w", ref, err)
	}
	return t, nil
}

// labels are the OCI labels the Dockerfile sets on each image.
func (o Options) labels(img image) map[string]string {
	created := "unknown"
	if !o.Created.IsZero() {
		created = o.Created.UTC().Format(time.RFC3339)
	}
	return map[string]string{
		"org.opencontainers.image.title":       img.title,
		"org.opencontainers.image.description": img.description,
		"org.opencontainers.image.source":      sourceURL,
		"org.opencontainers.image.version":     o.Version,
		"org.opencontainers.image.revision":    o.Revision,
		"org.opencontainers.image.created":     created,
	}
}

// writeImages assembles each kind from its binary in binDir, on the base
// layer (a layer tar file) given for it, and writes its archive. work is a
// scratch directory.
func writeImages(o Options, kinds []Kind, binDir string, base map[Kind]string, work string) ([]Image, error) {
	var out []Image
	for _, k := range kinds {
		spec := images()[k]
		img, err := writeImage(o, spec, filepath.Join(binDir, spec.binary), base[k], work)
		if err != nil {
			return nil, fmt.Errorf("building the %s image: %w", k, err)
		}
		out = append(out, img)
	}
	return out, nil
}

// writeImage assembles one image and writes its archive. binary is the
// built file of the image's first program; its extra programs are read
// from the same directory.
func writeImage(o Options, spec image, binary, baseLayer, work string) (Image, error) {
	tag, err := o.tag(spec)
	if err != nil {
		return Image{}, err
	}
	var adds []mutate.Addendum
	if baseLayer != "" {
		l, err := tarball.LayerFromFile(baseLayer)
		if err != nil {
			return Image{}, fmt.Errorf("reading the base layer %s: %w", baseLayer, err)
		}
		adds = append(adds, mutate.Addendum{Layer: l, History: v1.History{
			Created:   v1.Time{Time: o.Created},
			CreatedBy: fmt.Sprintf("debootstrap --variant=%s %s %s, packages and user %s", debianVariant, debianSuite, o.DebianMirror, agentUser),
		}})
	}
	programs := append([]program{{binary: spec.binary, path: spec.path}}, spec.extra...)
	for i, p := range programs {
		src := binary
		if i > 0 {
			src = filepath.Join(filepath.Dir(binary), p.binary)
		}
		layerFile := filepath.Join(work, p.binary+".tar.gz")
		if err := writeFileLayer(layerFile, src, p.path); err != nil {
			return Image{}, fmt.Errorf("packing %s: %w", p.binary, err)
		}
		l, err := tarball.LayerFromFile(layerFile)
		if err != nil {
			return Image{}, fmt.Errorf("reading the layer of %s: %w", p.binary, err)
		}
		adds = append(adds, mutate.Addendum{Layer: l, History: v1.History{
			Created:   v1.Time{Time: o.Created},
			CreatedBy: fmt.Sprintf("COPY %s %s", p.binary, p.path),
		}})
	}
	img, err := mutate.Append(empty.Image, adds...)
	if err != nil {
		return Image{}, fmt.Errorf("adding the layers: %w", err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return Image{}, fmt.Errorf("reading the image configuration: %w", err)
	}
	cf = cf.DeepCopy()
	cf.OS = "linux"
	cf.Architecture = runtime.GOARCH
	cf.Created = v1.Time{Time: o.Created}
	cf.Config = v1.Config{
		User:       spec.user,
		Entrypoint: spec.entrypoint,
		Cmd:        spec.cmd,
		Env:        []string{defaultPath},
		Labels:     o.labels(spec),
	}
	if img, err = mutate.ConfigFile(img, cf); err != nil {
		return Image{}, fmt.Errorf("setting the image configuration: %w", err)
	}

	return writeArchive(o, spec, tag, img, work)
}

// writeArchive writes img as spec's docker-archive tar file in o.OutDir,
// tagged tag, through a file in the scratch directory work.
func writeArchive(o Options, spec image, tag name.Tag, img v1.Image, work string) (Image, error) {
	archive := filepath.Join(o.OutDir, spec.name+".tar")
	tmp := filepath.Join(work, spec.name+".tar")
	if err := tarball.WriteToFile(tmp, tag, img); err != nil {
		return Image{}, fmt.Errorf("writing the archive: %w", err)
	}
	if err := os.Rename(tmp, archive); err != nil {
		return Image{}, fmt.Errorf("moving the archive into place: %w", err)
	}
	var size int64
	if fi, err := os.Stat(archive); err == nil {
		size = fi.Size()
	}
	fmt.Fprintf(o.Log, "%s: wrote %s (%.1f MB)\n", tag, archive, float64(size)/1e6)
	return Image{Kind: spec.kind, Ref: tag.String(), Archive: archive}, nil
}
