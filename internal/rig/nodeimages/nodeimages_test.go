package nodeimages

import (
	"archive/tar"
	"bytes"
	"debug/elf"
	"errors"
	"io"
	"os"
	"path"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"golang.org/x/sys/unix"
)

// created is the build time of the test images.
var created = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

// testOptions are complete options writing into a temporary directory.
func testOptions(t *testing.T, kinds ...Kind) Options {
	t.Helper()
	o, _, err := Options{
		RepoRoot: filepath.Join("..", "..", ".."),
		OutDir:   t.TempDir(),
		Tag:      "test",
		Version:  "v1.2.3",
		Revision: "0123abcd",
		Created:  created,
		Only:     kinds,
	}.complete()
	if err != nil {
		t.Fatal(err)
	}
	return o
}

// wantLabels are the labels of every test image titled title.
func wantLabels(title, description string) map[string]string {
	return map[string]string{
		"org.opencontainers.image.title":       title,
		"org.opencontainers.image.description": description,
		"org.opencontainers.image.source":      "https://github.com/bashtask/bashtask-operator",
		"org.opencontainers.image.version":     "v1.2.3",
		"org.opencontainers.image.revision":    "0123abcd",
		"org.opencontainers.image.created":     "2026-01-02T03:04:05Z",
	}
}

// entry is what a test checks of a tar entry.
type entry struct {
	Name     string // cleaned, relative; "." for the root
	Type     byte
	Mode     int64
	UID, GID int
	Link     string
}

// readArchive loads the image ref from the docker archive at path: the
// names in its manifest, its configuration and the entries of each layer.
func readArchive(t *testing.T, path, ref string) (tags []string, cfg *v1.ConfigFile, layers [][]entry) {
	t.Helper()
	opener := func() (io.ReadCloser, error) { return os.Open(path) }
	m, err := tarball.LoadManifest(opener)
	if err != nil {
		t.Fatalf("reading manifest.json of %s: %v", path, err)
	}
	for _, d := range m {
		tags = append(tags, d.RepoTags...)
	}
	tag, err := name.NewTag(ref)
	if err != nil {
		t.Fatal(err)
	}
	img, err := tarball.Image(opener, &tag)
	if err != nil {
		t.Fatalf("loading %s from %s: %v", ref, path, err)
	}
	if cfg, err = img.ConfigFile(); err != nil {
		t.Fatal(err)
	}
	ls, err := img.Layers()
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range ls {
		rc, err := l.Uncompressed()
		if err != nil {
			t.Fatal(err)
		}
		layers = append(layers, readTar(t, rc))
		rc.Close()
	}
	return tags, cfg, layers
}

// readTar lists the entries of a tar stream.
func readTar(t *testing.T, r io.Reader) []entry {
	t.Helper()
	var out []entry
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, entry{
			Name: path.Clean(h.Name), Type: h.Typeflag, Mode: h.Mode, UID: h.Uid, GID: h.Gid,
			Link: strings.TrimPrefix(h.Linkname, "./"),
		})
	}
}

// fakeBinary writes a stand-in for a program built by buildBinaries, so
// that the image tests need not compile the controller and the agent.
func fakeBinary(t *testing.T, dir, name string) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, name), []byte("#!/bin/true\n"), 0o700); err != nil {
		t.Fatal(err)
	}
}

// TestBuildPause builds the pause image through Build, compiling the pause
// program, and checks what an importer and the runtime read of it.
func TestBuildPause(t *testing.T) {
	o := testOptions(t, Pause)
	got, err := Build(t.Context(), o)
	if err != nil {
		t.Fatal(err)
	}
	want := []Image{{Kind: Pause, Ref: "localhost/bashtask/pause:test", Archive: filepath.Join(o.OutDir, "pause.tar")}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Fatalf("Build() (-want +got):\n%s", diff)
	}
	tags, cfg, layers := readArchive(t, got[0].Archive, got[0].Ref)
	if diff := cmp.Diff([]string{"localhost/bashtask/pause:test"}, tags); diff != "" {
		t.Errorf("RepoTags (-want +got):\n%s", diff)
	}
	wantCfg := v1.Config{
		User:       "65535:65535",
		Entrypoint: []string{"/pause"},
		Env:        []string{defaultPath},
		Labels: wantLabels("bashtask-pause",
			"Pod sandbox process: holds the pod's namespaces and reaps orphans"),
	}
	if diff := cmp.Diff(wantCfg, cfg.Config); diff != "" {
		t.Errorf("config (-want +got):\n%s", diff)
	}
	if cfg.OS != "linux" || cfg.Architecture != runtime.GOARCH || !cfg.Created.Equal(created) {
		t.Errorf("platform and time: %s/%s %v, want linux/%s %v", cfg.OS, cfg.Architecture, cfg.Created, runtime.GOARCH, created)
	}
	wantLayers := [][]entry{{{Name: "pause", Type: tar.TypeReg, Mode: 0o755}}}
	if diff := cmp.Diff(wantLayers, layers); diff != "" {
		t.Errorf("layers (-want +got):\n%s", diff)
	}
	// A static executable: an empty image has no dynamic loader.
	tag, err := name.NewTag(got[0].Ref)
	if err != nil {
		t.Fatal(err)
	}
	img, err := tarball.ImageFromPath(got[0].Archive, &tag)
	if err != nil {
		t.Fatal(err)
	}
	fsTar := mutate.Extract(img)
	defer fsTar.Close()
	tr := tar.NewReader(fsTar)
	if _, err := tr.Next(); err != nil {
		t.Fatal(err)
	}
	bin, err := io.ReadAll(tr)
	if err != nil {
		t.Fatal(err)
	}
	exe, err := elf.NewFile(bytes.NewReader(bin))
	if err != nil {
		t.Fatalf("/pause is not an ELF executable: %v", err)
	}
	for _, p := range exe.Progs {
		if p.Type == elf.PT_INTERP {
			t.Error("/pause names a dynamic loader: it was not built static")
		}
	}
}

// TestControllerImage assembles the controller image around a stand-in
// binary: what the Dockerfile's controller target sets.
func TestControllerImage(t *testing.T) {
	o := testOptions(t, Controller)
	work := t.TempDir()
	fakeBinary(t, filepath.Join(work, "bin"), "bashtask-controller")
	got, err := writeImages(o, []Kind{Controller}, filepath.Join(work, "bin"), nil, work)
	if err != nil {
		t.Fatal(err)
	}
	ref := "localhost/bashtask/bashtask-controller:test"
	want := []Image{{Kind: Controller, Ref: ref, Archive: filepath.Join(o.OutDir, "bashtask-controller.tar")}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Fatalf("writeImages() (-want +got):\n%s", diff)
	}
	tags, cfg, layers := readArchive(t, got[0].Archive, ref)
	if diff := cmp.Diff([]string{ref}, tags); diff != "" {
		t.Errorf("RepoTags (-want +got):\n%s", diff)
	}
	wantCfg := v1.Config{
		User:       "65532:65532",
		Entrypoint: []string{"/bashtask-controller"},
		Env:        []string{defaultPath},
		Labels: wantLabels("bashtask-controller",
			"Reconciles BashTask resources through the node agents"),
	}
	if diff := cmp.Diff(wantCfg, cfg.Config); diff != "" {
		t.Errorf("config (-want +got):\n%s", diff)
	}
	// The binary is made executable by everyone whatever its mode on disk.
	wantLayers := [][]entry{{{Name: "bashtask-controller", Type: tar.TypeReg, Mode: 0o755}}}
	if diff := cmp.Diff(wantLayers, layers); diff != "" {
		t.Errorf("layers (-want +got):\n%s", diff)
	}
}

// TestAgentImage packs a small tree with packRootFS, as the agent's root
// file system is packed after debootstrap, and assembles the agent image
// on it: the tar keeps links, modes and owners, leaves out the contents of
// /dev, /proc and /sys, and the binary goes on top. Owners and device
// nodes are only checked as root, who alone can make them.
func TestAgentImage(t *testing.T) {
	root := filepath.Join(t.TempDir(), "root")
	asRoot := os.Geteuid() == 0
	// Modes are Unix modes (os.FileMode has other bits for setuid and
	// sticky), set past the umask.
	mkdir := func(p string, mode uint32) {
		t.Helper()
		if err := os.MkdirAll(filepath.Join(root, p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := unix.Chmod(filepath.Join(root, p), mode); err != nil {
			t.Fatal(err)
		}
	}
	write := func(p string, mode uint32) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(root, p), []byte(p), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := unix.Chmod(filepath.Join(root, p), mode); err != nil {
			t.Fatal(err)
		}
	}
	mkdir("", 0o700) // as os.MkdirTemp makes it
	mkdir("usr/bin", 0o755)
	mkdir("dev/pts", 0o755)
	mkdir("proc/1", 0o755)
	mkdir("sys/kernel", 0o755)
	mkdir("tmp", 0o1777)
	mkdir("home/bashtask", 0o755)
	write("usr/bin/su", 0o4755)
	write("proc/1/status", 0o444)
	write("sys/kernel/x", 0o444)
	write("home/bashtask/.profile", 0o644)
	if err := os.Link(filepath.Join(root, "usr/bin/su"), filepath.Join(root, "usr/bin/su2")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("usr/bin", filepath.Join(root, "bin")); err != nil {
		t.Fatal(err)
	}
	user := 0
	if asRoot {
		user = agentUID
		for _, p := range []string{"home/bashtask", "home/bashtask/.profile"} {
			if err := os.Lchown(filepath.Join(root, p), agentUID, agentGID); err != nil {
				t.Fatal(err)
			}
		}
		for _, p := range []string{"dev/null", "usr/null"} {
			if err := unix.Mknod(filepath.Join(root, p), unix.S_IFCHR|0o666, int(unix.Mkdev(1, 3))); err != nil {
				t.Fatal(err)
			}
			if err := unix.Chmod(filepath.Join(root, p), 0o666); err != nil {
				t.Fatal(err)
			}
		}
	} else {
		t.Log("not root: owners and device nodes are not checked")
	}

	work := t.TempDir()
	base := filepath.Join(work, "base.tar.gz")
	if err := packRootFS(t.Context(), root, base); err != nil {
		t.Fatal(err)
	}
	o := testOptions(t, Agent)
	fakeBinary(t, filepath.Join(work, "bin"), "bashtask-agent")
	fakeBinary(t, filepath.Join(work, "bin"), "bashtask-shim")
	got, err := writeImages(o, []Kind{Agent}, filepath.Join(work, "bin"), map[Kind]string{Agent: base}, work)
	if err != nil {
		t.Fatal(err)
	}
	ref := "localhost/bashtask/bashtask-agent:test"
	_, cfg, layers := readArchive(t, got[0].Archive, ref)
	wantCfg := v1.Config{
		Entrypoint: []string{"/usr/local/bin/bashtask-agent"},
		Cmd:        []string{"serve"},
		Env:        []string{defaultPath},
		Labels: wantLabels("bashtask-agent",
			"Node-local executor agent for BashTask resources"),
	}
	if diff := cmp.Diff(wantCfg, cfg.Config); diff != "" {
		t.Errorf("config (-want +got):\n%s", diff)
	}

	own := func(e entry) entry { e.UID, e.GID = user, user; return e }
	wantBase := []entry{
		{Name: ".", Type: tar.TypeDir, Mode: 0o755},
		{Name: "bin", Type: tar.TypeSymlink, Mode: 0o777, Link: "usr/bin"},
		{Name: "dev", Type: tar.TypeDir, Mode: 0o755},
		{Name: "home", Type: tar.TypeDir, Mode: 0o755},
		own(entry{Name: "home/bashtask", Type: tar.TypeDir, Mode: 0o755}),
		own(entry{Name: "home/bashtask/.profile", Type: tar.TypeReg, Mode: 0o644}),
		{Name: "proc", Type: tar.TypeDir, Mode: 0o755},
		{Name: "sys", Type: tar.TypeDir, Mode: 0o755},
		{Name: "tmp", Type: tar.TypeDir, Mode: 0o1777},
		{Name: "usr", Type: tar.TypeDir, Mode: 0o755},
		{Name: "usr/bin", Type: tar.TypeDir, Mode: 0o755},
		{Name: "usr/bin/su", Type: tar.TypeReg, Mode: 0o4755},
		{Name: "usr/bin/su2", Type: tar.TypeLink, Mode: 0o4755, Link: "usr/bin/su"},
	}
	if asRoot {
		wantBase = append(wantBase, entry{Name: "usr/null", Type: tar.TypeChar, Mode: 0o666})
	}
	wantLayers := [][]entry{wantBase, {
		{Name: "usr", Type: tar.TypeDir, Mode: 0o755},
		{Name: "usr/local", Type: tar.TypeDir, Mode: 0o755},
		{Name: "usr/local/bin", Type: tar.TypeDir, Mode: 0o755},
		{Name: "usr/local/bin/bashtask-agent", Type: tar.TypeReg, Mode: 0o755},
	}, {
		{Name: "usr", Type: tar.TypeDir, Mode: 0o755},
		{Name: "usr/local", Type: tar.TypeDir, Mode: 0o755},
		{Name: "usr/local/bin", Type: tar.TypeDir, Mode: 0o755},
		{Name: "usr/local/bin/bashtask-shim", Type: tar.TypeReg, Mode: 0o755},
	}}
	if diff := cmp.Diff(wantLayers, layers); diff != "" {
		t.Errorf("layers (-want +got):\n%s", diff)
	}
	if len(cfg.History) != 3 || !strings.HasPrefix(cfg.History[0].CreatedBy, "debootstrap --variant=minbase bookworm") ||
		cfg.History[2].CreatedBy != "COPY bashtask-shim /usr/local/bin/bashtask-shim" {
		t.Errorf("history: %+v", cfg.History)
	}
}

// TestSlimRootFS checks what the slim variant keeps of a tree.
func TestSlimRootFS(t *testing.T) {
	root := t.TempDir()
	for _, p := range []string{
		"usr/share/doc/bash/copyright",
		"usr/share/doc/bash/changelog.Debian.gz",
		"usr/share/doc/git/contrib/README",
		"usr/share/man/man1/bash.1.gz",
		"usr/share/locale/de/LC_MESSAGES/coreutils.mo",
		"usr/share/locale/locale.alias",
		"usr/share/zoneinfo/UTC",
		"usr/bin/bash",
	} {
		if err := os.MkdirAll(filepath.Join(root, filepath.Dir(p)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(root, p), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink("bash", filepath.Join(root, "usr/share/doc/bash-builtins")); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(root, "etc/dpkg/dpkg.cfg.d"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := slimRootFS(root); err != nil {
		t.Fatal(err)
	}
	var got []string
	err := filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		rel, err := filepath.Rel(root, p)
		got = append(got, rel)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		"etc/dpkg/dpkg.cfg.d/slim",
		"usr/bin/bash",
		"usr/share/doc/bash/copyright",
		"usr/share/doc/bash-builtins",
		"usr/share/locale/locale.alias",
		"usr/share/zoneinfo/UTC",
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("files left (-want +got):\n%s", diff)
	}
	for _, gone := range []string{"usr/share/man/man1", "usr/share/doc/git", "usr/share/locale/de"} {
		if _, err := os.Lstat(filepath.Join(root, gone)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s: %v, want it removed", gone, err)
		}
	}
	cfg, err := os.ReadFile(filepath.Join(root, slimDpkgConfig))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range []string{"path-exclude /usr/share/doc/*", "path-include /usr/share/doc/*/copyright"} {
		if !strings.Contains(string(cfg), line+"\n") {
			t.Errorf("dpkg configuration lacks %q:\n%s", line, cfg)
		}
	}
}

// TestRecipeKey checks that the cache key of the agent's root file system
// follows what the tree is made of, and only that.
func TestRecipeKey(t *testing.T) {
	base, err := agentRecipe(DefaultDebianMirror, "amd64")
	if err != nil {
		t.Fatal(err)
	}
	same, err := agentRecipe(DefaultDebianMirror, "amd64")
	if err != nil {
		t.Fatal(err)
	}
	if base.key() != same.key() {
		t.Fatal("two equal recipes have different keys")
	}
	changes := map[string]func(*rootFSRecipe){
		"mirror":   func(r *rootFSRecipe) { r.Mirror = "http://mirror.example/debian" },
		"arch":     func(r *rootFSRecipe) { r.Arch = "arm64" },
		"package":  func(r *rootFSRecipe) { r.Packages = append(r.Packages, "less") },
		"uid":      func(r *rootFSRecipe) { r.UID++ },
		"shell":    func(r *rootFSRecipe) { r.Shell = "/bin/sh" },
		"revision": func(r *rootFSRecipe) { r.Revision++ },
	}
	for name, change := range changes {
		t.Run(name, func(t *testing.T) {
			r := base
			r.Packages = append([]string(nil), base.Packages...)
			change(&r)
			if r.key() == base.key() {
				t.Errorf("changing the %s keeps the key %s", name, base.key())
			}
		})
	}
}

// TestOptionsErrors checks what Build refuses before doing anything.
func TestOptionsErrors(t *testing.T) {
	tests := map[string]Options{
		"no tag":         {},
		"latest":         {Tag: "latest"},
		"invalid tag":    {Tag: "v1+dirty"},
		"unknown image":  {Tag: "t", Only: []Kind{"operator"}},
		"invalid prefix": {Tag: "t", Repository: "Local/Host"},
	}
	for name, o := range tests {
		t.Run(name, func(t *testing.T) {
			o.OutDir = t.TempDir()
			if _, err := Build(t.Context(), o); err == nil {
				t.Fatal("Build() succeeded")
			}
			if entries, _ := os.ReadDir(o.OutDir); len(entries) != 0 {
				t.Errorf("Build() wrote %d files before failing", len(entries))
			}
		})
	}
}
