//go:build linux

package image

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	rigtestutil "github.com/bashtask/bashtask-operator/internal/rig/testutil"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/compression"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/static"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"golang.org/x/sys/unix"
)

func TestPullByTagAndDigest(t *testing.T) {
	reg := newTestRegistry(t, nil)
	s := openStore(t, StoreOptions{})
	v1img := makeImage(t, arch, tarLayer(t, member{name: "etc/version", data: "one"}))
	d1 := push(t, reg.host, "app:latest", v1img)

	var last, total int64
	im, err := s.Pull(context.Background(), reg.host+"/app:latest", PullOptions{Progress: func(done, tot int64) { last, total = done, tot }})
	if err != nil {
		t.Fatal(err)
	}
	if im.Digest != d1 || im.ManifestDigest != d1 {
		t.Fatalf("digest %s, manifest %s; pushed %s", im.Digest, im.ManifestDigest, d1)
	}
	if total == 0 || last != total {
		t.Fatalf("progress ended at %d of %d", last, total)
	}
	if im.Config.WorkingDir != "/work" || len(im.Layers) != 1 || im.Size != 3 || im.Hit {
		t.Fatalf("image %+v", im)
	}
	if b, err := os.ReadFile(filepath.Join(im.Layers[0], "etc/version")); err != nil || string(b) != "one" {
		t.Fatalf("etc/version: %q, %v", b, err)
	}
	if _, err := os.Stat(filepath.Join(s.Root(), im.Links[0], "etc/version")); err != nil {
		t.Fatalf("short link: %v", err)
	}
	if _, err := os.Stat(s.recordPath(d1)); err != nil {
		t.Fatalf("record: %v", err)
	}
	im.Release()

	// The tag moves; a pull by the first digest still gets the first image
	// and never asks for the tag.
	d2 := push(t, reg.host, "app:latest", makeImage(t, arch, tarLayer(t, member{name: "etc/version", data: "two"})))
	tagGets := reg.pathGets("/manifests/latest")
	for _, st := range []*Store{s, openStore(t, StoreOptions{})} {
		im, err := st.Pull(context.Background(), reg.host+"/app@"+d1, PullOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if b, _ := os.ReadFile(filepath.Join(im.Layers[0], "etc/version")); im.Digest != d1 || string(b) != "one" {
			t.Fatalf("by digest: %s %q", im.Digest, b)
		}
		im.Release()
	}
	if n := reg.pathGets("/manifests/latest"); n != tagGets {
		t.Fatalf("a pull by digest asked for the tag %d times", n-tagGets)
	}
	im, err = s.Pull(context.Background(), reg.host+"/app:latest", PullOptions{})
	if err != nil || im.Digest != d2 {
		t.Fatalf("the moved tag: %v %v", im, err)
	}
	im.Release()
	held, err := s.Acquire(d1)
	if err != nil || held.Digest != d1 {
		t.Fatalf("Acquire: %v %v", held, err)
	}
	held.Release()
}

func TestUnpackFileKinds(t *testing.T) {
	reg := newTestRegistry(t, nil)
	s := openStore(t, StoreOptions{})
	const sparseSize = 64 << 20
	layer := tarLayer(t,
		member{name: "./", typ: tar.TypeDir, mode: 0o755},
		member{name: "d/", typ: tar.TypeDir, mode: 0o750, uid: 1000, gid: 1001},
		member{name: "d/file", data: "hello", uid: 1000, gid: 1001, xattrs: map[string]string{"user.note": "kept", "trusted.overlay.redirect": "/etc", "security.selinux": "x"}},
		member{name: "d/hard", typ: tar.TypeLink, link: "d/file"},
		member{name: "d/sym", typ: tar.TypeSymlink, link: "../../../../etc/passwd"},
		member{name: "d/fifo", typ: tar.TypeFifo, mode: 0o620, uid: 7, gid: 8},
		member{name: "suid", mode: 0o4755, uid: 0, gid: 0, data: "#!/bin/sh"},
		member{name: "sgid", mode: 0o2711, uid: 1234, gid: 5678, data: "x"},
		member{name: "sticky/", typ: tar.TypeDir, mode: 0o1777},
		member{name: "sparse", size: sparseSize, data: "head"},
		member{name: "dev/null", typ: tar.TypeChar, mode: 0o666},
		member{name: "dev/sda", typ: tar.TypeBlock, mode: 0o660},
		member{name: "implicit/parent/file", data: "p"},
	)
	push(t, reg.host, "kinds:1", makeImage(t, arch, layer))
	im, err := s.Pull(context.Background(), reg.host+"/kinds:1", PullOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer im.Release()
	root := im.Layers[0]
	check := func(rel string, kind uint32, mode uint32, uid, gid uint32) unix.Stat_t {
		t.Helper()
		var st unix.Stat_t
		if err := unix.Lstat(filepath.Join(root, rel), &st); err != nil {
			t.Fatal(err)
		}
		if st.Mode&unix.S_IFMT != kind || (kind != unix.S_IFLNK && st.Mode&0o7777 != mode) || st.Uid != uid || st.Gid != gid {
			t.Errorf("%s: mode %o owner %d:%d, want %o|%o %d:%d", rel, st.Mode, st.Uid, st.Gid, kind, mode, uid, gid)
		}
		if kind != unix.S_IFLNK && !strings.HasPrefix(rel, "implicit") && st.Mtim.Sec != 1700000000 {
			t.Errorf("%s: mtime %d", rel, st.Mtim.Sec)
		}
		return st
	}
	check("d", unix.S_IFDIR, 0o750, 1000, 1001)
	f := check("d/file", unix.S_IFREG, 0o644, 1000, 1001)
	h := check("d/hard", unix.S_IFREG, 0o644, 1000, 1001)
	if f.Ino != h.Ino || f.Nlink != 2 {
		t.Errorf("d/hard is not a hard link of d/file: inodes %d %d, nlink %d", f.Ino, h.Ino, f.Nlink)
	}
	check("d/sym", unix.S_IFLNK, 0, 0, 0)
	if got, _ := os.Readlink(filepath.Join(root, "d/sym")); got != "../../../../etc/passwd" {
		t.Errorf("d/sym -> %q", got)
	}
	check("d/fifo", unix.S_IFIFO, 0o620, 7, 8)
	check("suid", unix.S_IFREG, 0o4755, 0, 0)
	check("sgid", unix.S_IFREG, 0o2711, 1234, 5678)
	check("sticky", unix.S_IFDIR, 0o1777, 0, 0)
	check("implicit/parent", unix.S_IFDIR, 0o755, 0, 0)
	sp := check("sparse", unix.S_IFREG, 0o644, 0, 0)
	if sp.Size != sparseSize || sp.Blocks*512 > 1<<20 {
		t.Errorf("sparse: size %d, %d bytes allocated (holes not kept)", sp.Size, sp.Blocks*512)
	}
	buf := make([]byte, 64)
	if n, _ := unix.Getxattr(filepath.Join(root, "d/file"), "user.note", buf); string(buf[:n]) != "kept" {
		t.Errorf("user.note: %q", buf[:n])
	}
	for _, x := range []string{"trusted.overlay.redirect", "security.selinux"} {
		if _, err := unix.Getxattr(filepath.Join(root, "d/file"), x, buf); !errors.Is(err, unix.ENODATA) {
			t.Errorf("%s kept: %v", x, err)
		}
	}
	if _, err := os.Lstat(filepath.Join(root, "dev/null")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a device node was made: %v", err)
	}
	if want := (UnpackCounts{Devices: 2, Xattrs: 2}); im.Unpacked != want {
		t.Errorf("counts %+v, want %+v", im.Unpacked, want)
	}
	// The sparse file's first block holds data: 4096 bytes are written.
	if im.Size != int64(len("hello")+len("#!/bin/sh")+len("x")+4096+len("p")) {
		t.Errorf("size %d", im.Size)
	}
}

// whiteoutImage is a base with a/keep, a/gone, o/old and a top layer that
// deletes a/gone and makes o opaque with o/new.
func whiteoutImage(t *testing.T) v1.Image {
	base := tarLayer(t,
		member{name: "a/", typ: tar.TypeDir, mode: 0o755},
		member{name: "a/keep", data: "k"},
		member{name: "a/gone", data: "g"},
		member{name: "o/", typ: tar.TypeDir, mode: 0o755},
		member{name: "o/old", data: "o"},
	)
	top := tarLayer(t,
		member{name: "a/", typ: tar.TypeDir, mode: 0o755},
		member{name: "a/.wh.gone", data: ""},
		member{name: "o/", typ: tar.TypeDir, mode: 0o755},
		member{name: "o/.wh..wh..opq", data: ""},
		member{name: "o/new", data: "n"},
	)
	return makeImage(t, arch, base, top)
}

func TestWhiteouts(t *testing.T) {
	reg := newTestRegistry(t, nil)
	s := openStore(t, StoreOptions{})
	push(t, reg.host, "wh:1", whiteoutImage(t))
	im, err := s.Pull(context.Background(), reg.host+"/wh:1", PullOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer im.Release()
	top := im.Layers[0]
	var st unix.Stat_t
	if err := unix.Lstat(filepath.Join(top, "a/gone"), &st); err != nil {
		t.Fatal(err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFCHR || st.Rdev != 0 {
		t.Fatalf("a/gone: mode %o rdev %d, want a character device 0/0", st.Mode, st.Rdev)
	}
	if _, err := os.Lstat(filepath.Join(top, "a/.wh.gone")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the .wh. member itself was made: %v", err)
	}
	buf := make([]byte, 8)
	if n, err := unix.Getxattr(filepath.Join(top, "o"), opaqueXattr, buf); err != nil || string(buf[:n]) != "y" {
		t.Fatalf("o: %s = %q, %v", opaqueXattr, buf[:n], err)
	}
	if want := (UnpackCounts{Whiteouts: 1, OpaqueDirs: 1}); im.Unpacked != want {
		t.Errorf("counts %+v, want %+v", im.Unpacked, want)
	}
	mountOverlay(t, im)
}

// mountOverlay mounts the image's layers read-only and checks what the
// whiteouts hide.
func mountOverlay(t *testing.T, im *Image) {
	mnt := t.TempDir()
	opts := "lowerdir=" + strings.Join(im.Layers, ":")
	if err := unix.Mount("overlay", mnt, "overlay", unix.MS_RDONLY, opts); err != nil {
		rigtestutil.SkipUnlessStrictf(t, "the overlay end check is skipped: mounting overlayfs here failed: %v", err)
	}
	defer func() { _ = unix.Unmount(mnt, unix.MNT_DETACH) }()
	for rel, want := range map[string]bool{"a/keep": true, "a/gone": false, "o/old": false, "o/new": true} {
		_, err := os.Lstat(filepath.Join(mnt, rel))
		if got := err == nil; got != want {
			t.Errorf("overlay: %s present %v, want %v (%v)", rel, got, want, err)
		}
	}
}

func TestPathEscapesRefused(t *testing.T) {
	reg := newTestRegistry(t, nil)
	outside := t.TempDir()
	cases := map[string][]member{
		"dotdot":          {{name: "../x", data: "x"}},
		"rooted dotdot":   {{name: "/../x", data: "x"}},
		"absolute":        {{name: "/etc/x", data: "x"}},
		"hard link out":   {{name: "h", typ: tar.TypeLink, link: "../../etc/passwd"}},
		"symlink parent":  {{name: "evil", typ: tar.TypeSymlink, link: outside}, {name: "evil/x", data: "x"}},
		"relative parent": {{name: "evil", typ: tar.TypeSymlink, link: "../../../.."}, {name: "evil/x", data: "x"}},
		"lower hard link": {{name: "h", typ: tar.TypeLink, link: "etc/passwd"}},
	}
	i := 0
	for name, ms := range cases {
		t.Run(name, func(t *testing.T) {
			s := openStore(t, StoreOptions{})
			l := tarLayer(t, ms...)
			i++
			tag := fmt.Sprintf("esc:%d", i)
			push(t, reg.host, tag, makeImage(t, arch, l))
			_, err := s.Pull(context.Background(), reg.host+"/"+tag, PullOptions{})
			var me *MemberError
			if !errors.As(err, &me) || !errors.Is(err, ErrInvalid) || Reason(err) != ReasonInvalid {
				t.Fatalf("want a refused member, got %v", err)
			}
			last := ms[len(ms)-1].name
			if me.Layer != digestOf(t, l) || me.Member != last || !strings.Contains(err.Error(), digestOf(t, l)) || !strings.Contains(err.Error(), last) {
				t.Fatalf("the error does not name the layer and the member: %v", err)
			}
			if got := dirEntries(t, outside); len(got) != 0 {
				t.Fatalf("written outside: %v", got)
			}
			for _, d := range []string{dirLayers, dirTmp, dirImages, dirLinks} {
				if got := dirEntries(t, filepath.Join(s.Root(), d)); len(got) != 0 {
					t.Fatalf("%s/ after the refusal: %v", d, got)
				}
			}
		})
	}
}

func TestConcurrentPullsFetchEachBlobOnce(t *testing.T) {
	reg := newTestRegistry(t, nil)
	reg.blobDelay = 50 * time.Millisecond
	promReg := prometheus.NewRegistry()
	s := openStore(t, StoreOptions{Registerer: promReg})
	shared := tarLayer(t, member{name: "shared", data: "s"})
	a := makeImage(t, arch, shared, tarLayer(t, member{name: "a1", data: "a1"}), tarLayer(t, member{name: "a2", data: "a2"}))
	b := makeImage(t, arch, shared, tarLayer(t, member{name: "b", data: "b"}))
	push(t, reg.host, "a:1", a)
	push(t, reg.host, "b:1", b)
	var wg sync.WaitGroup
	errs := make(chan error, 3)
	for _, ref := range []string{"a:1", "a:1", "b:1"} {
		wg.Go(func() {
			im, err := s.Pull(context.Background(), reg.host+"/"+ref, PullOptions{})
			if err == nil {
				defer im.Release()
			}
			errs <- err
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	for _, img := range []v1.Image{a, b} {
		ls, _ := img.Layers()
		for _, l := range ls {
			if n := reg.blobGets(digestOf(t, l)); n != 1 {
				t.Errorf("layer %s fetched %d times", digestOf(t, l), n)
			}
		}
	}
	if got := dirEntries(t, filepath.Join(s.Root(), dirLayers)); len(got) != 4 {
		t.Errorf("layers/: %v, want 4", got)
	}
	if h, m := testutil.ToFloat64(s.m.hits), testutil.ToFloat64(s.m.misses); h+m != 3 || m < 2 {
		t.Errorf("hits %v misses %v", h, m)
	}
	im, err := s.Pull(context.Background(), reg.host+"/b:1", PullOptions{})
	if err != nil || !im.Hit {
		t.Fatalf("a pull of stored layers: %+v %v", im, err)
	}
	im.Release()
	if n, err := testutil.GatherAndCount(promReg); err != nil || n != 6 {
		t.Errorf("metrics registered: %d %v", n, err)
	}
}

// sizedImage is an image of a shared base layer and a layer of its own
// of size bytes.
func sizedImage(t *testing.T, base v1.Layer, tag string, size int64) v1.Image {
	return makeImage(t, arch, base, tarLayer(t, member{name: tag, size: size, data: strings.Repeat(tag, int(size)/len(tag))}))
}

func TestEvictionLRU(t *testing.T) {
	reg := newTestRegistry(t, nil)
	base := tarLayer(t, member{name: "base", data: "0123456789"})
	for _, tag := range []string{"a", "b", "c", "d"} {
		push(t, reg.host, "img:"+tag, sizedImage(t, base, tag, 1000))
	}
	// Room for the base and two images' own layers.
	s := openStore(t, StoreOptions{BudgetBytes: 2010})
	pull := func(tag string) *Image {
		t.Helper()
		im, err := s.Pull(context.Background(), reg.host+"/img:"+tag, PullOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return im
	}
	a := pull("a")
	b := pull("b")
	a.Release()
	b.Release()
	// a is used again: b is now the least recently used.
	a2, err := s.Acquire(a.ManifestDigest)
	if err != nil {
		t.Fatal(err)
	}
	a2.Release()
	c := pull("c")
	if _, err := s.Acquire(b.ManifestDigest); !errors.Is(err, ErrNotFound) {
		t.Fatalf("b, the least recently used, was not evicted: %v", err)
	}
	if _, err := os.Stat(b.Layers[0]); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("b's own layer stays: %v", err)
	}
	if _, err := os.Stat(b.Layers[1]); err != nil {
		t.Fatalf("the shared base went with b: %v", err)
	}
	// c is held and, once a is used again, the least recently used: d
	// evicts a, not c.
	a3, err := s.Acquire(a.ManifestDigest)
	if err != nil {
		t.Fatal(err)
	}
	a3.Release()
	d := pull("d")
	defer d.Release()
	if _, err := s.Acquire(a.ManifestDigest); !errors.Is(err, ErrNotFound) {
		t.Fatalf("a was not evicted: %v", err)
	}
	if _, err := os.Stat(c.Layers[0]); err != nil {
		t.Fatalf("held c was evicted: %v", err)
	}
	c.Release()
	if s.Bytes() > 2010 || testutil.ToFloat64(s.m.evictions) != 2 {
		t.Fatalf("bytes %d evictions %v", s.Bytes(), testutil.ToFloat64(s.m.evictions))
	}
}

func TestOverBudgetLeavesNothing(t *testing.T) {
	reg := newTestRegistry(t, nil)
	push(t, reg.host, "big:layers", makeImage(t, arch, tarLayer(t, member{name: "x", size: 600, data: "x"}), tarLayer(t, member{name: "y", size: 600, data: "y"})))
	push(t, reg.host, "big:one", makeImage(t, arch, tarLayer(t, member{name: "z", size: 1 << 22, data: strings.Repeat("z", 1<<22)})))
	for _, tag := range []string{"layers", "one"} {
		t.Run(tag, func(t *testing.T) {
			s := openStore(t, StoreOptions{BudgetBytes: 1000})
			_, err := s.Pull(context.Background(), reg.host+"/big:"+tag, PullOptions{})
			var be *BudgetError
			if !errors.As(err, &be) || !errors.Is(err, ErrOverBudget) || be.Budget != 1000 || be.Size <= 1000 || !strings.Contains(err.Error(), "1000 bytes") {
				t.Fatalf("want a budget error, got %v", err)
			}
			for _, d := range []string{dirLayers, dirTmp, dirImages, dirLinks} {
				if got := dirEntries(t, filepath.Join(s.Root(), d)); len(got) != 0 {
					t.Fatalf("%s/ after the refusal: %v", d, got)
				}
			}
			if s.Bytes() != 0 {
				t.Fatalf("bytes %d", s.Bytes())
			}
		})
	}
}

func TestOpenRemovesAnInterruptedUnpack(t *testing.T) {
	needRoot(t)
	reg := newTestRegistry(t, nil)
	l := tarLayer(t, member{name: "f", data: "complete"})
	push(t, reg.host, "int:1", makeImage(t, arch, l))
	root := filepath.Join(t.TempDir(), "images")
	s, err := Open(root, StoreOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Open(root, StoreOptions{}); err == nil {
		t.Fatal("a second Open of the same root succeeded")
	}
	s.Close()
	// What a pull killed while unpacking leaves: its temporary layer, and
	// a layer renamed in whose image was never recorded.
	half := filepath.Join(root, dirTmp, "layer-1", "l")
	if err := os.MkdirAll(half, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(half, "f"), []byte("compl"), 0o644); err != nil {
		t.Fatal(err)
	}
	diffID, _ := l.DiffID()
	if err := os.MkdirAll(filepath.Join(root, dirLayers, keyName(diffID.String())), 0o755); err != nil {
		t.Fatal(err)
	}
	s = openStore2(t, root)
	for _, d := range []string{dirTmp, dirLayers} {
		if got := dirEntries(t, filepath.Join(root, d)); len(got) != 0 {
			t.Fatalf("%s/ after Open: %v", d, got)
		}
	}
	im, err := s.Pull(context.Background(), reg.host+"/int:1", PullOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer im.Release()
	if b, _ := os.ReadFile(filepath.Join(im.Layers[0], "f")); string(b) != "complete" || reg.blobGets(digestOf(t, l)) != 1 {
		t.Fatalf("f = %q after %d fetches", b, reg.blobGets(digestOf(t, l)))
	}
	// A restart keeps a complete image.
	s.Close()
	s = openStore2(t, root)
	if _, err := s.Acquire(im.Digest); err != nil {
		t.Fatal(err)
	}
}

func openStore2(t *testing.T, root string) *Store {
	t.Helper()
	s, err := Open(root, StoreOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func TestPullErrors(t *testing.T) {
	reg := newTestRegistry(t, nil)
	s := openStore(t, StoreOptions{})
	_, err := s.Pull(context.Background(), reg.host+"/missing:1", PullOptions{})
	if !errors.Is(err, ErrNotFound) || Reason(err) != ReasonNotFound || !strings.Contains(err.Error(), "NAME_UNKNOWN") {
		t.Fatalf("a missing repository: %v", err)
	}
	push(t, reg.host, "there:1", makeImage(t, arch, tarLayer(t, member{name: "f", data: "f"})))
	_, err = s.Pull(context.Background(), reg.host+"/there:2", PullOptions{})
	if !errors.Is(err, ErrNotFound) || !strings.Contains(err.Error(), "MANIFEST_UNKNOWN") {
		t.Fatalf("a missing tag: %v", err)
	}
	_, err = s.Pull(context.Background(), reg.host+"/there@sha256:"+strings.Repeat("a", 64), PullOptions{})
	if !errors.Is(err, ErrNotFound) {
		t.Fatalf("a missing digest: %v", err)
	}

	// An index with only another architecture.
	other := "s390x"
	if arch == other {
		other = "riscv64"
	}
	img, err := random.Image(10, 1)
	if err != nil {
		t.Fatal(err)
	}
	idx := mutate.AppendManifests(empty.Index, mutate.IndexAddendum{Add: img, Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: other}}})
	ref, _ := name.ParseReference(reg.host + "/multi:1")
	if err := remote.WriteIndex(ref, idx); err != nil {
		t.Fatal(err)
	}
	_, err = s.Pull(context.Background(), ref.String(), PullOptions{})
	var pe *PlatformError
	if !errors.As(err, &pe) || !errors.Is(err, ErrUnsupported) || Reason(err) != ReasonUnsupported || !strings.Contains(err.Error(), "linux/"+other) {
		t.Fatalf("platform mismatch: %v", err)
	}
	// The same index with this node's platform too: its image is picked,
	// the index's digest recorded.
	mine := makeImage(t, arch, tarLayer(t, member{name: "mine", data: "m"}))
	idx = mutate.AppendManifests(idx, mutate.IndexAddendum{Add: mine, Descriptor: v1.Descriptor{Platform: &s.platform}})
	if err := remote.WriteIndex(ref, idx); err != nil {
		t.Fatal(err)
	}
	im, err := s.Pull(context.Background(), ref.String(), PullOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer im.Release()
	idxDigest, _ := idx.Digest()
	mineDigest, _ := mine.Digest()
	if im.Digest != idxDigest.String() || im.ManifestDigest != mineDigest.String() {
		t.Fatalf("digest %s manifest %s; index %s image %s", im.Digest, im.ManifestDigest, idxDigest, mineDigest)
	}
	if held, err := s.Acquire(idxDigest.String()); err != nil {
		t.Fatalf("Acquire by the index digest: %v", err)
	} else {
		held.Release()
	}
	if Reason(errors.New("connection reset")) != ReasonRetryable || !Retryable(fmt.Errorf("x: %w", context.DeadlineExceeded)) {
		t.Fatal("other errors are retryable")
	}
}

func TestUnauthorized(t *testing.T) {
	const user, pass = "puller", "s3cret"
	basic := func(h http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if u, p, ok := r.BasicAuth(); !ok || u != user || p != pass {
				w.Header().Set("WWW-Authenticate", `Basic realm="test"`)
				http.Error(w, `{"errors":[{"code":"UNAUTHORIZED","message":"authentication required"}]}`, http.StatusUnauthorized)
				return
			}
			h.ServeHTTP(w, r)
		})
	}
	reg := newTestRegistry(t, basic)
	img := makeImage(t, arch, tarLayer(t, member{name: "f", data: "secret"}))
	ref, _ := name.ParseReference(reg.host + "/private:1")
	if err := remote.Write(ref, img, remote.WithAuth(&authn.Basic{Username: user, Password: pass})); err != nil {
		t.Fatal(err)
	}
	s := openStore(t, StoreOptions{})
	_, err := s.Pull(context.Background(), ref.String(), PullOptions{})
	if !errors.Is(err, ErrUnauthorized) || Reason(err) != ReasonUnauthorized || !strings.Contains(err.Error(), "UNAUTHORIZED") {
		t.Fatalf("no credentials: %v", err)
	}
	wrong, err := KeychainFromDockerConfigJSON(dockerConfig(reg.host, user, "wrong"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Pull(context.Background(), ref.String(), PullOptions{Keychain: wrong}); !errors.Is(err, ErrUnauthorized) {
		t.Fatalf("wrong credentials: %v", err)
	}
	kc, err := KeychainFromDockerConfigJSON(dockerConfig(reg.host, user, pass))
	if err != nil {
		t.Fatal(err)
	}
	im, err := s.Pull(context.Background(), ref.String(), PullOptions{Keychain: kc})
	if err != nil {
		t.Fatal(err)
	}
	im.Release()
	if _, err := KeychainFromDockerConfigJSON([]byte("{")); err == nil {
		t.Fatal("a broken .dockerconfigjson was taken")
	}
}

func dockerConfig(host, user, pass string) []byte {
	auth := base64.StdEncoding.EncodeToString([]byte(user + ":" + pass))
	return fmt.Appendf(nil, `{"auths":{%q:{"auth":%q}}}`, host, auth)
}

func TestMirrorsAndPlainHTTP(t *testing.T) {
	reg := newTestRegistry(t, nil)
	push(t, reg.host, "lib/app:1", makeImage(t, arch, tarLayer(t, member{name: "f", data: "mirrored"})))
	// Every name resolves to the test registry; only plain.test:5000 is
	// listed as plain HTTP, so the other names are spoken to over TLS.
	tr := &http.Transport{DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, network, reg.host)
	}}
	plain := []string{"plain.test:5000", "mirror.test:5000"}
	s := openStore(t, StoreOptions{transport: tr, PlainHTTP: plain[:1]})
	im, err := s.Pull(context.Background(), "plain.test:5000/lib/app:1", PullOptions{})
	if err != nil {
		t.Fatalf("a listed plain-HTTP registry: %v", err)
	}
	im.Release()
	if _, err := s.Pull(context.Background(), "tls.test:5000/lib/app:1", PullOptions{}); err == nil {
		t.Fatal("an unlisted registry was spoken to over plain HTTP")
	}
	// docker.io is never reached: its mirror serves the image.
	s = openStore(t, StoreOptions{transport: tr, PlainHTTP: plain, Mirrors: map[string][]string{"docker.io": {"down.test:1", "mirror.test:5000"}}})
	im, err = s.Pull(context.Background(), "docker.io/lib/app:1", PullOptions{})
	if err != nil {
		t.Fatalf("through the mirror: %v", err)
	}
	defer im.Release()
	if b, _ := os.ReadFile(filepath.Join(im.Layers[0], "f")); string(b) != "mirrored" {
		t.Fatalf("f = %q", b)
	}
}

func TestLayerCompressionsAndLayerLimit(t *testing.T) {
	reg := newTestRegistry(t, nil)
	s := openStore(t, StoreOptions{})
	b := tarBytes(t, []member{{name: "z", data: "zstd"}})
	zl, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil },
		tarball.WithCompression(compression.ZStd), tarball.WithMediaType(types.OCILayerZStd))
	if err != nil {
		t.Fatal(err)
	}
	ul := static.NewLayer(tarBytes(t, []member{{name: "u", data: "plain"}}), types.OCIUncompressedLayer)
	push(t, reg.host, "comp:1", makeImage(t, arch, zl, ul))
	im, err := s.Pull(context.Background(), reg.host+"/comp:1", PullOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer im.Release()
	for i, f := range map[int]string{1: "z", 0: "u"} {
		if _, err := os.Stat(filepath.Join(im.Layers[i], f)); err != nil {
			t.Errorf("layer %d: %v", i, err)
		}
	}

	many, err := random.Image(16, MaxLayers+1)
	if err != nil {
		t.Fatal(err)
	}
	push(t, reg.host, "many:1", many)
	if _, err := s.Pull(context.Background(), reg.host+"/many:1", PullOptions{}); !errors.Is(err, ErrUnsupported) || !strings.Contains(err.Error(), "129 layers") {
		t.Fatalf("%d layers: %v", MaxLayers+1, err)
	}
}
