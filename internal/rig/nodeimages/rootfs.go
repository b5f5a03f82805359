package nodeimages

import (
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
)

// The agent's root file system: the Dockerfile's debian:bookworm-slim base
// with its apt-get install and useradd, made by debootstrap.
const (
	debianSuite   = "bookworm"
	debianVariant = "minbase"
	// rootFSRevision is part of the cache key: raise it when the steps
	// below change what they produce in a way the recipe does not show.
	rootFSRevision = 1
	// agentUser is the unprivileged account tasks run as (the chart's
	// agent.runAsUser), made as the Dockerfile's groupadd and useradd do.
	agentUser  = "bashtask"
	agentUID   = 10001
	agentGID   = 10001
	agentHome  = "/home/bashtask"
	agentShell = "/bin/bash"
)

// agentPackages are the packages the Dockerfile installs on the agent's
// base. debootstrap installs them with their dependencies and without
// recommended packages, as apt-get install --no-install-recommends.
func agentPackages() []string {
	return []string{
		"bash", "coreutils", "findutils", "grep", "sed", "gawk", "diffutils", "procps", "util-linux",
		"tar", "gzip", "xz-utils", "bzip2", "unzip", "zip", "ca-certificates", "curl", "jq", "git", "openssh-client",
		"e2fsprogs", // mkfs.ext4, for the working directories' file systems (--task-disk-size)
	}
}

// rootFSRecipe is everything that decides the agent's root file system;
// its hash names the cached layer.
type rootFSRecipe struct {
	Revision int      `json:"revision"`
	Suite    string   `json:"suite"`
	Variant  string   `json:"variant"`
	Mirror   string   `json:"mirror"`
	Arch     string   `json:"arch"`
	Packages []string `json:"packages"`
	User     string   `json:"user"`
	UID      int      `json:"uid"`
	GID      int      `json:"gid"`
	Home     string   `json:"home"`
	Shell    string   `json:"shell"`
}

// agentRecipe is the recipe of the agent's root file system from mirror
// for the Go architecture goarch.
func agentRecipe(mirror, goarch string) (rootFSRecipe, error) {
	arch, err := debianArch(goarch)
	if err != nil {
		return rootFSRecipe{}, err
	}
	return rootFSRecipe{
		Revision: rootFSRevision,
		Suite:    debianSuite,
		Variant:  debianVariant,
		Mirror:   mirror,
		Arch:     arch,
		Packages: agentPackages(),
		User:     agentUser,
		UID:      agentUID,
		GID:      agentGID,
		Home:     agentHome,
		Shell:    agentShell,
	}, nil
}

// debianArch is Debian's name of the Go architecture goarch.
func debianArch(goarch string) (string, error) {
	switch goarch {
	case "amd64", "arm64", "riscv64", "s390x":
		return goarch, nil
	case "386":
		return "i386", nil
	case "arm":
		return "armhf", nil
	case "ppc64le":
		return "ppc64el", nil
	}
	return "", fmt.Errorf("no Debian architecture for GOARCH %s", goarch)
}

// key is a short hash of the recipe, for the cache file's name.
func (r rootFSRecipe) key() string {
	b, err := json.Marshal(r)
	if err != nil {
		panic(err) // strings and ints only
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:8])
}

// rootFSCachePrefix starts the name of every cached root file system of
// the agent; taskRootFSCachePrefix those of the task image.
const (
	rootFSCachePrefix     = "agent-rootfs-"
	taskRootFSCachePrefix = "task-rootfs-"
)

// agentRootFS returns the path of the agent's root file system as a
// gzip-compressed layer tar in o's cache (see cachedRootFS).
func agentRootFS(ctx context.Context, o Options) (string, error) {
	r, err := agentRecipe(o.DebianMirror, runtime.GOARCH)
	if err != nil {
		return "", err
	}
	return cachedRootFS(ctx, o, r, rootFSCachePrefix, "agent")
}

// cachedRootFS returns the path of r's root file system as a
// gzip-compressed layer tar in o's cache, named prefix and r's key, making
// it first when the cache has none for r: debootstrap with the packages,
// the user (when r has one), the apt caches removed, packed with GNU tar.
// It then removes the cached layers of prefix's other recipes. what names
// the tree in log lines and errors.
func cachedRootFS(ctx context.Context, o Options, r rootFSRecipe, prefix, what string) (path string, err error) {
	path = filepath.Join(o.cacheDir(), prefix+r.key()+".tar.gz")
	if _, err := os.Stat(path); err == nil {
		fmt.Fprintf(o.Log, "%s root file system: cached in %s\n", what, path)
		return path, nil
	} else if !errors.Is(err, fs.ErrNotExist) {
		return "", err
	}
	if os.Geteuid() != 0 {
		return "", fmt.Errorf("%s is not cached and making it needs root (debootstrap, chroot)", path)
	}
	if _, err := exec.LookPath("debootstrap"); err != nil {
		return "", fmt.Errorf("debootstrap is missing (apt-get install debootstrap): %w", err)
	}

	work, err := os.MkdirTemp(o.cacheDir(), ".rootfs-")
	if err != nil {
		return "", err
	}
	defer func() {
		// A killed debootstrap leaves /proc and /sys mounted in the tree.
		err = errors.Join(err, unmountUnder(work), os.RemoveAll(work))
	}()
	fmt.Fprintf(o.Log, "%s root file system: debootstrap %s from %s (not cached: %s)\n", what, r.Suite, r.Mirror, path)
	if err := makeRootFS(ctx, r, filepath.Join(work, "root")); err != nil {
		return "", err
	}
	fmt.Fprintf(o.Log, "%s root file system: packing %s\n", what, path)
	tmp := filepath.Join(work, "layer.tar.gz")
	if err := packRootFS(ctx, filepath.Join(work, "root"), tmp); err != nil {
		return "", fmt.Errorf("packing the tree: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return "", err
	}
	if err := pruneRootFSCache(o.cacheDir(), prefix, filepath.Base(path)); err != nil {
		return "", err
	}
	return path, nil
}

// makeRootFS makes r's tree at root: debootstrap, r's user when it has
// one, then the apt caches, documentation and translations removed.
func makeRootFS(ctx context.Context, r rootFSRecipe, root string) error {
	if err := debootstrap(ctx, r, root); err != nil {
		return fmt.Errorf("debootstrap: %w", err)
	}
	if r.User != "" {
		if err := addUser(ctx, r, root); err != nil {
			return fmt.Errorf("adding the user %s: %w", r.User, err)
		}
	}
	if err := trimRootFS(ctx, root); err != nil {
		return fmt.Errorf("removing the apt caches: %w", err)
	}
	if err := slimRootFS(root); err != nil {
		return fmt.Errorf("removing documentation and translations: %w", err)
	}
	return nil
}

// debootstrap makes a minimal Debian tree at root with r's packages.
// Release files must be signed by a key of Debian's keyring
// (--force-check-gpg): without the keyring debootstrap would go on
// unchecked.
func debootstrap(ctx context.Context, r rootFSRecipe, root string) error {
	args := []string{
		"--variant=" + r.Variant,
		"--arch=" + r.Arch,
		"--components=main",
		"--include=" + strings.Join(r.Packages, ","),
		"--force-check-gpg",
		r.Suite, root, r.Mirror,
	}
	return run(command(ctx, "/", hostToolEnv(), "debootstrap", args...))
}

// addUser adds r's group and user in the tree at root, with the
// Dockerfile's groupadd and useradd.
func addUser(ctx context.Context, r rootFSRecipe, root string) error {
	if err := run(command(ctx, "/", hostToolEnv(), "chroot", root,
		"groupadd", "--gid", strconv.Itoa(r.GID), r.User)); err != nil {
		return err
	}
	return run(command(ctx, "/", hostToolEnv(), "chroot", root,
		"useradd", "--uid", strconv.Itoa(r.UID), "--gid", strconv.Itoa(r.GID),
		"--create-home", "--home-dir", r.Home, "--shell", r.Shell, r.User))
}

// trimRootFS removes from the tree at root what an image should not carry:
// the downloaded .debs and apt's package lists (as the Dockerfile's rm -rf
// /var/lib/apt/lists/*), the logs of the installation, and the host's
// resolv.conf and hostname, which debootstrap copies and the container
// runtime provides.
func trimRootFS(ctx context.Context, root string) error {
	if err := run(command(ctx, "/", hostToolEnv(), "chroot", root, "apt-get", "clean")); err != nil {
		return err
	}
	var errs []error
	for _, pattern := range []string{
		"var/lib/apt/lists/*",
		"var/cache/apt/archives/*.deb",
		"var/log/apt/*",
		"var/log/dpkg.log",
		"var/log/alternatives.log",
		"var/log/bootstrap.log",
		"etc/resolv.conf",
		"etc/hostname",
	} {
		matches, err := filepath.Glob(filepath.Join(root, pattern))
		if err != nil {
			return err
		}
		for _, m := range matches {
			errs = append(errs, os.RemoveAll(m))
		}
	}
	return errors.Join(errs...)
}

// slimDpkgConfig is the dpkg configuration file of the "slim" variant of
// Debian's images, which the Dockerfile's debian:bookworm-slim is:
// documentation, manual pages and translations are left out (about 65 MB
// of the agent's 250 MB tree), the copyright files kept, and the file keeps
// them out of packages installed later.
const slimDpkgConfig = "etc/dpkg/dpkg.cfg.d/slim"

// slimExcludes are the directories whose contents are left out, and
// slimIncludes the patterns of what is kept in them.
func slimExcludes() []string {
	return []string{
		"/usr/share/doc", "/usr/share/info", "/usr/share/linda",
		"/usr/share/lintian/overrides", "/usr/share/locale", "/usr/share/man",
	}
}

func slimIncludes() []string {
	return []string{"/usr/share/doc/*/copyright", "/usr/share/locale/locale.alias"}
}

// slimRootFS makes the tree at root the slim variant: it removes every
// file below slimExcludes but slimIncludes, then the directories left
// empty, and writes the dpkg configuration that keeps it so. Symbolic
// links stay (documentation directories of one package linked to
// another's): they are a few bytes each.
func slimRootFS(root string) error {
	var cfg strings.Builder
	cfg.WriteString("# The \"slim\" variant: documentation, manual pages and translations are\n")
	cfg.WriteString("# left out of the image, and this keeps them out of packages installed later.\n")
	for _, dir := range slimExcludes() {
		fmt.Fprintf(&cfg, "path-exclude %s/*\n", dir)
		if err := removeFilesBelow(filepath.Join(root, dir), dir); err != nil {
			return err
		}
	}
	for _, inc := range slimIncludes() {
		fmt.Fprintf(&cfg, "path-include %s\n", inc)
	}
	return os.WriteFile(filepath.Join(root, slimDpkgConfig), []byte(cfg.String()), 0o644)
}

// removeFilesBelow removes what is below the directory dir, which is
// inImage in the image, except directories, symbolic links and files
// matching slimIncludes, and then the directories left empty, deepest
// first. A missing dir is no error.
func removeFilesBelow(dir, inImage string) error {
	var dirs []string
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) && p == dir {
				return fs.SkipAll
			}
			return err
		}
		if p == dir {
			return nil
		}
		if d.IsDir() {
			dirs = append(dirs, p)
			return nil
		}
		if d.Type()&fs.ModeSymlink != 0 {
			return nil
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil {
			return err
		}
		abs := path.Join(inImage, filepath.ToSlash(rel))
		for _, inc := range slimIncludes() {
			if ok, _ := path.Match(inc, abs); ok {
				return nil
			}
		}
		return os.Remove(p)
	})
	if err != nil {
		return err
	}
	// WalkDir visits parents first: backwards is deepest first.
	for i := len(dirs) - 1; i >= 0; i-- {
		if entries, err := os.ReadDir(dirs[i]); err == nil && len(entries) == 0 {
			if err := os.Remove(dirs[i]); err != nil {
				return err
			}
		}
	}
	return nil
}

// packRootFS writes the tree at root to dst as a gzip-compressed layer
// tar. GNU tar keeps what an image needs: numeric owners, modes with the
// setuid and sticky bits, symbolic and hard links, device nodes, and file
// capabilities (security.capability, hence the POSIX format). The contents
// of /dev, /proc and /sys are left out (the runtime mounts them), their
// directories kept. Per-file access, change and sub-second modification
// times are left out too, and entries are sorted: the same tree gives the
// same tar. The tree's top directory is made 0755 first: it becomes the
// image's / and a temporary directory's 0700 would lock every user but
// root out.
func packRootFS(ctx context.Context, root, dst string) (err error) {
	if err := os.Chmod(root, 0o755); err != nil {
		return err
	}
	out, err := os.Create(dst)
	if err != nil {
		return err
	}
	defer func() {
		if cerr := out.Close(); cerr != nil && err == nil {
			err = cerr
		}
	}()
	zw, err := gzip.NewWriterLevel(out, gzip.BestSpeed)
	if err != nil {
		return err
	}
	cmd := command(ctx, "/", hostToolEnv(), "tar",
		"--create", "--file=-", "--directory="+root,
		"--numeric-owner", "--sort=name",
		"--format=posix", "--pax-option=exthdr.name=%d/PaxHeaders/%f,delete=atime,delete=ctime,delete=mtime",
		"--xattrs", "--xattrs-include=security.capability",
		"--exclude=./dev/*", "--exclude=./proc/*", "--exclude=./sys/*",
		".")
	cmd.Stdout = zw
	if err := run(cmd); err != nil {
		return err
	}
	if err := zw.Close(); err != nil {
		return err
	}
	return out.Sync()
}

// pruneRootFSCache removes the cached root file systems in dir named
// prefix other than keep: they belong to recipes that changed since.
func pruneRootFSCache(dir, prefix, keep string) error {
	matches, err := filepath.Glob(filepath.Join(dir, prefix+"*.tar.gz"))
	if err != nil {
		return err
	}
	var errs []error
	for _, m := range matches {
		if filepath.Base(m) != keep {
			errs = append(errs, os.Remove(m))
		}
	}
	return errors.Join(errs...)
}
