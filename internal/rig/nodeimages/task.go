package nodeimages

import (
	"archive/tar"
	"cmp"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// The task images: what a BashTask's or a BashWorkspace's bash runs in
// when it names an image (docs/images.md, "Images on the machine").
const (
	// TaskSmall is bash and BusyBox, both static, with an /etc/passwd and
	// /etc/group naming root and a /tmp: a few MiB, built in a second from
	// Debian's bash-static and busybox-static installed on the machine.
	TaskSmall Kind = "task-small"
	// Task is the default environment: Debian bookworm's minimal tree
	// made by debootstrap, as the agent's, with the tools an agent's
	// commands expect (taskPackages); cached as the agent's tree is.
	Task Kind = "task"
)

// TaskKinds returns the task images, in the order Build makes them.
func TaskKinds() []Kind { return []Kind{TaskSmall, Task} }

// The machine's files TaskSmall is made of (Debian's bash-static and
// busybox-static; hack/test-packages.sh installs them).
const (
	HostBashStatic = "/bin/bash-static"
	HostBusybox    = "/bin/busybox"
)

// taskPackages are the packages of the Task image beyond debootstrap's
// minbase. No C compiler: gcc and libc6-dev add about 200 MB to the tree
// and a minute or two to a cold build, on every machine that builds it; a
// task that compiles names an image that has one (docs/images.md).
// python3-pip (it brings setuptools and wheel) installs pure-Python
// packages into the image's system paths, which a workspace keeps;
// apt-get cannot (it wants uid 0, which no task has).
func taskPackages() []string {
	return []string{
		"bash", "coreutils", "findutils", "grep", "sed", "gawk", "diffutils", "procps", "less", "file",
		"tar", "gzip", "xz-utils", "bzip2", "unzip", "zip", "ca-certificates", "curl", "jq", "git", "openssh-client",
		"python3", "python3-venv", "python3-pip",
	}
}

// taskRecipe is the recipe of the Task image's tree from mirror for the
// Go architecture goarch: no user (the shim adds the task's to
// /etc/passwd).
func taskRecipe(mirror, goarch string) (rootFSRecipe, error) {
	arch, err := debianArch(goarch)
	if err != nil {
		return rootFSRecipe{}, err
	}
	return rootFSRecipe{
		Revision: rootFSRevision, Suite: debianSuite, Variant: debianVariant,
		Mirror: mirror, Arch: arch, Packages: taskPackages(),
	}, nil
}

// TaskRootFSCached reports whether the Task image's tree from the Debian
// archive mirror (DefaultDebianMirror when empty) is in the cache of the
// output directory outDir (Options.OutDir), so that building the Task image takes seconds rather
// than the minutes of debootstrap.
func TaskRootFSCached(outDir, mirror string) bool {
	r, err := taskRecipe(cmp.Or(mirror, DefaultDebianMirror), runtime.GOARCH)
	if err != nil {
		return false
	}
	_, err = os.Stat(filepath.Join(outDir, "cache", taskRootFSCachePrefix+r.key()+".tar.gz"))
	return err == nil
}

// taskImages describes the task images.
func taskImages() map[Kind]image {
	return map[Kind]image{
		TaskSmall: {
			kind: TaskSmall, name: "task-small", title: "bashtask-task-small",
			description: "bash and BusyBox, static, for BashTasks",
			cmd:         []string{"/bin/bash"},
		},
		Task: {
			kind: Task, name: "bashtask-task", title: "bashtask-task",
			description: "Debian bookworm with bash, git, curl and python3, for BashTasks",
			cmd:         []string{"/bin/bash"},
		},
	}
}

// spec is the description of the image k, a node or a task image.
func spec(k Kind) image {
	if s, ok := images()[k]; ok {
		return s
	}
	return taskImages()[k]
}

// buildTaskImages builds the task images among kinds, in the order of
// TaskKinds, and writes their archives. work is a scratch directory.
func buildTaskImages(ctx context.Context, o Options, kinds []Kind, work string) ([]Image, error) {
	var out []Image
	for _, k := range TaskKinds() {
		if !slices.Contains(kinds, k) {
			continue
		}
		layer, createdBy, err := taskLayer(ctx, o, k, work)
		if err != nil {
			return nil, fmt.Errorf("building the %s image: %w", k, err)
		}
		img, err := writeTaskImage(o, taskImages()[k], layer, createdBy, work)
		if err != nil {
			return nil, fmt.Errorf("building the %s image: %w", k, err)
		}
		out = append(out, img)
	}
	return out, nil
}

// taskLayer returns the file of the one layer of the task image k and its
// history line.
func taskLayer(ctx context.Context, o Options, k Kind, work string) (string, string, error) {
	if k == TaskSmall {
		dst := filepath.Join(work, "task-small.tar.gz")
		if err := writeTaskSmallLayer(dst); err != nil {
			return "", "", err
		}
		return dst, "COPY bash-static busybox-static, passwd, group, /tmp", nil
	}
	r, err := taskRecipe(o.DebianMirror, runtime.GOARCH)
	if err != nil {
		return "", "", err
	}
	p, err := cachedRootFS(ctx, o, r, taskRootFSCachePrefix, "task")
	if err != nil {
		return "", "", fmt.Errorf("the root file system: %w", err)
	}
	return p, fmt.Sprintf("debootstrap --variant=%s %s %s, packages %s", r.Variant, r.Suite, r.Mirror, strings.Join(r.Packages, ",")), nil
}

// writeTaskImage assembles a task image of the layer file layer and writes
// its archive.
func writeTaskImage(o Options, spec image, layer, createdBy, work string) (Image, error) {
	tag, err := o.tag(spec)
	if err != nil {
		return Image{}, err
	}
	l, err := tarball.LayerFromFile(layer)
	if err != nil {
		return Image{}, fmt.Errorf("reading the layer %s: %w", layer, err)
	}
	img, err := mutate.Append(empty.Image, mutate.Addendum{Layer: l, History: v1.History{
		Created: v1.Time{Time: o.Created}, CreatedBy: createdBy,
	}})
	if err != nil {
		return Image{}, fmt.Errorf("adding the layer: %w", err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return Image{}, fmt.Errorf("reading the image configuration: %w", err)
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", runtime.GOARCH
	cf.Created = v1.Time{Time: o.Created}
	cf.Config = v1.Config{Cmd: spec.cmd, Env: []string{defaultPath}, Labels: o.labels(spec)}
	if img, err = mutate.ConfigFile(img, cf); err != nil {
		return Image{}, fmt.Errorf("setting the image configuration: %w", err)
	}
	return writeArchive(o, spec, tag, img, work)
}

// taskSmallPasswd and taskSmallGroup name root alone; the shim adds the
// task's user (docs/images.md).
const (
	taskSmallPasswd = "root:x:0:0:root:/root:/bin/bash\n"
	taskSmallGroup  = "root:x:0:\n"
)

// writeTaskSmallLayer writes the TaskSmall layer to dst, gzip-compressed:
// the directories, /bin/bash (HostBashStatic), /bin/busybox with a
// symbolic link to it for every applet of `busybox --list-full` (bash
// excepted), /etc/passwd and /etc/group, root-owned, every entry at the
// Unix epoch so that the same files give the same digest. A missing
// static binary is an error naming the Debian package.
func writeTaskSmallLayer(dst string) (err error) {
	for file, pkg := range map[string]string{HostBashStatic: "bash-static", HostBusybox: "busybox-static"} {
		if _, err := os.Stat(file); err != nil {
			return fmt.Errorf("%s is missing (apt-get install %s, or hack/test-packages.sh): %w", file, pkg, err)
		}
	}
	applets, err := busyboxApplets(HostBusybox)
	if err != nil {
		return err
	}
	out, err := os.Create(dst)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, out.Close()) }()
	zw, err := gzip.NewWriterLevel(out, gzip.BestSpeed)
	if err != nil {
		return err
	}
	tw := &layerWriter{tw: tar.NewWriter(zw)}
	for _, d := range []struct {
		name string
		mode int64
	}{{"bin", 0o755}, {"etc", 0o755}, {"root", 0o700}, {"sbin", 0o755}, {"tmp", 0o1777}, {"usr", 0o755}, {"usr/bin", 0o755}, {"usr/sbin", 0o755}} {
		tw.dir(d.name, d.mode)
	}
	tw.file("bin/bash", HostBashStatic, 0o755)
	tw.file("bin/busybox", HostBusybox, 0o755)
	for _, a := range applets {
		tw.symlink(a, "/bin/busybox")
	}
	tw.data("etc/passwd", taskSmallPasswd, 0o644)
	tw.data("etc/group", taskSmallGroup, 0o644)
	return errors.Join(tw.err, tw.tw.Close(), zw.Close())
}

// appletDirs are the directories of the applets' links, the image's PATH
// less /usr/local; busybox also lists /linuxrc, which is left out.
func appletDirs() []string { return []string{"bin", "sbin", "usr/bin", "usr/sbin"} }

// busyboxApplets lists the applets' paths of the busybox at bin, relative
// to /, sorted, without bash (the image's bash is bash), busybox and
// applets outside appletDirs.
func busyboxApplets(bin string) ([]string, error) {
	out, err := exec.Command(bin, "--list-full").Output()
	if err != nil {
		return nil, fmt.Errorf("%s --list-full: %w", bin, err)
	}
	var applets []string
	for _, line := range strings.Fields(string(out)) {
		p := path.Clean(strings.TrimPrefix(line, "/"))
		if path.Base(p) == "bash" || path.Base(p) == "busybox" || !slices.Contains(appletDirs(), path.Dir(p)) {
			continue
		}
		applets = append(applets, p)
	}
	slices.Sort(applets)
	return slices.Compact(applets), nil
}

// layerWriter writes root-owned tar entries at the Unix epoch, keeping the
// first error.
type layerWriter struct {
	tw  *tar.Writer
	err error
}

func (w *layerWriter) header(h *tar.Header) {
	if w.err != nil {
		return
	}
	h.ModTime = time.Unix(0, 0)
	h.Format = tar.FormatPAX
	w.err = w.tw.WriteHeader(h)
}

func (w *layerWriter) dir(name string, mode int64) {
	w.header(&tar.Header{Typeflag: tar.TypeDir, Name: name + "/", Mode: mode})
}

func (w *layerWriter) symlink(name, target string) {
	w.header(&tar.Header{Typeflag: tar.TypeSymlink, Name: name, Linkname: target, Mode: 0o777})
}

func (w *layerWriter) data(name, content string, mode int64) {
	w.header(&tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: mode, Size: int64(len(content))})
	if w.err == nil {
		_, w.err = io.WriteString(w.tw, content)
	}
}

func (w *layerWriter) file(name, src string, mode int64) {
	if w.err != nil {
		return
	}
	f, err := os.Open(src)
	if err != nil {
		w.err = err
		return
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		w.err = err
		return
	}
	w.header(&tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: mode, Size: fi.Size()})
	if w.err == nil {
		_, w.err = io.Copy(w.tw, f)
	}
}
