//go:build linux

package snapshot

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/bashtask/bashtask-operator/internal/rig/testutil"

	"github.com/google/go-cmp/cmp"
	"github.com/klauspost/compress/zstd"
	"golang.org/x/sys/unix"
)

const (
	ownerUID, ownerGID     = 52001, 52001
	restoreUID, restoreGID = 53002, 53002
)

func requireRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: the snapshot keeps and maps file owners")
	}
}

// entry is what a round trip must keep of one tree entry.
type entry struct {
	Kind   string
	Mode   uint32
	UID    uint32
	GID    uint32
	Size   int64
	Mtime  int64
	Target string
	SHA256 string
	Ranges string // sparse files: their data ranges
	Link   string // the first path of the same inode, for hard links
}

// manifest describes the tree below dir, without following links.
func manifest(t *testing.T, dir string) map[string]entry {
	t.Helper()
	out := map[string]entry{}
	inodes := map[uint64]string{}
	err := filepath.WalkDir(dir, func(p string, _ os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		if rel == "lost+found" {
			return filepath.SkipDir
		}
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil {
			return err
		}
		e := entry{Mode: st.Mode & 0o7777, UID: st.Uid, GID: st.Gid, Mtime: st.Mtim.Nano()}
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFDIR:
			e.Kind = "dir"
		case unix.S_IFLNK:
			e.Kind = "symlink"
			e.Target, _ = os.Readlink(p)
		case unix.S_IFIFO:
			e.Kind = "fifo"
		case unix.S_IFREG:
			e.Kind, e.Size = "file", st.Size
			if first, ok := inodes[st.Ino]; ok {
				e.Link = first
			} else {
				inodes[st.Ino] = rel
			}
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			sum := sha256.Sum256(b)
			e.SHA256 = hex.EncodeToString(sum[:])
			if st.Blocks*512 < st.Size {
				fd, err := unix.Open(p, unix.O_RDONLY, 0)
				if err != nil {
					return err
				}
				rs, err := dataRanges(fd, st.Size)
				unix.Close(fd)
				if err != nil {
					return err
				}
				e.Ranges = formatSparseMap(rs)
			}
		default:
			e.Kind = "other"
		}
		out[rel] = e
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// mapOwner returns m with every owner replaced, as a restore maps them.
func mapOwner(m map[string]entry, uid, gid uint32) map[string]entry {
	out := map[string]entry{}
	for k, e := range m {
		e.UID, e.GID = uid, gid
		out[k] = e
	}
	return out
}

func mustRun(t *testing.T, fn func() error) {
	t.Helper()
	if err := fn(); err != nil {
		t.Fatal(err)
	}
}

// buildTree makes a tree of every kind a snapshot keeps, owned by the
// owner, with fixed modification times at nanosecond precision.
func buildTree(t *testing.T, dir string) {
	t.Helper()
	w := func(rel, data string, mode os.FileMode) {
		p := filepath.Join(dir, rel)
		mustRun(t, func() error { return os.WriteFile(p, []byte(data), 0o600) })
		mustRun(t, func() error { return os.Chmod(p, mode) })
	}
	for _, d := range []string{"src", "src/pkg", "empty", "empty/nested-empty", "locked", "sticky"} {
		mustRun(t, func() error { return os.Mkdir(filepath.Join(dir, d), 0o755) })
	}
	w("README", "hello\n", 0o644)
	w("src/main.go", strings.Repeat("package main\n", 1000), 0o640)
	w("src/pkg/run.sh", "#!/bin/sh\necho hi\n", 0o755)
	w("secret", "only me\n", 0o600)
	w("none", "no permissions\n", 0)
	w("setid", "set-id bits\n", 0o6755)
	w("locked/inside", "in a read-only directory\n", 0o444)
	w("empty-file", "", 0o644)
	mustRun(t, func() error { return os.Chmod(filepath.Join(dir, "locked"), 0o500) })
	mustRun(t, func() error { return os.Chmod(filepath.Join(dir, "sticky"), 0o1777) })
	mustRun(t, func() error { return os.Symlink("src/main.go", filepath.Join(dir, "link-rel")) })
	mustRun(t, func() error { return os.Symlink("/etc/shadow", filepath.Join(dir, "link-out")) })
	mustRun(t, func() error { return os.Symlink("does/not/exist", filepath.Join(dir, "link-dangling")) })
	mustRun(t, func() error { return os.Symlink("..", filepath.Join(dir, "src/up")) })
	mustRun(t, func() error { return os.Link(filepath.Join(dir, "README"), filepath.Join(dir, "src/README-hard")) })
	mustRun(t, func() error { return os.Link(filepath.Join(dir, "README"), filepath.Join(dir, "empty/README-hard2")) })
	mustRun(t, func() error { return unix.Mkfifo(filepath.Join(dir, "fifo"), 0o620) })
	// A sparse file: 64 MiB with two data ranges.
	sp, err := os.Create(filepath.Join(dir, "sparse"))
	if err != nil {
		t.Fatal(err)
	}
	_, err1 := sp.WriteAt(bytes.Repeat([]byte("a"), 8192), 1<<20)
	_, err2 := sp.WriteAt(bytes.Repeat([]byte("b"), 4096), 40<<20)
	mustRun(t, func() error { return errors.Join(err1, err2, sp.Truncate(64<<20), sp.Close()) })
	// Files above the restore's pool size (1 MiB), which the reader
	// writes as it streams: a plain one, a set-ID one, and a sparse one
	// that ends in a hole.
	big := make([]byte, 3<<20+17)
	for i := range big {
		big[i] = byte(i*7 + i>>13)
	}
	w("big", string(big), 0o4750)
	spb, err := os.Create(filepath.Join(dir, "sparse-big"))
	if err != nil {
		t.Fatal(err)
	}
	_, err1 = spb.WriteAt(big[:2<<20], 0)
	_, err2 = spb.WriteAt(big[:1<<20], 10<<20)
	mustRun(t, func() error { return errors.Join(err1, err2, spb.Truncate(20<<20), spb.Close()) })
	// A sparse file that is only a hole.
	mustRun(t, func() error { return os.Truncate(filepath.Join(dir, "empty-file"), 0) })
	hole, err := os.Create(filepath.Join(dir, "hole"))
	if err != nil {
		t.Fatal(err)
	}
	mustRun(t, func() error { return errors.Join(hole.Truncate(16<<20), hole.Close()) })

	mtime := time.Date(2026, 11, 3, 4, 5, 6, 123456789, time.UTC)
	err = filepath.WalkDir(dir, func(p string, _ os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		mtime = mtime.Add(time.Second + 7*time.Nanosecond)
		ts := []unix.Timespec{unix.NsecToTimespec(mtime.UnixNano()), unix.NsecToTimespec(mtime.UnixNano())}
		return errors.Join(unix.Lchown(p, ownerUID, ownerGID), unix.UtimesNanoAt(unix.AT_FDCWD, p, ts, unix.AT_SYMLINK_NOFOLLOW))
	})
	if err != nil {
		t.Fatal(err)
	}
	// Directories last: their entries' times above changed theirs. Walk
	// again deepest first by sorting on depth.
	for _, d := range []string{"src/pkg", "empty/nested-empty", "src", "empty", "locked", "sticky", "."} {
		ts := []unix.Timespec{unix.NsecToTimespec(mtime.UnixNano()), unix.NsecToTimespec(mtime.UnixNano())}
		mtime = mtime.Add(time.Second)
		mustRun(t, func() error { return unix.UtimesNanoAt(unix.AT_FDCWD, filepath.Join(dir, d), ts, 0) })
	}
	// The restore chowns the root: the source's root must be the owner's too.
	mustRun(t, func() error { return os.Chmod(dir, 0o700) })
}

func openDir(t *testing.T, dir string) *os.File {
	t.Helper()
	f, err := os.OpenFile(dir, os.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}

func TestRoundTripEveryKind(t *testing.T) {
	requireRoot(t)
	src, dst := t.TempDir(), t.TempDir()
	buildTree(t, src)
	want := manifest(t, src)

	var archive bytes.Buffer
	state := []StateFile{{Name: "carry-env", Mode: 0o600, Data: []byte("STAGE=build\x00")}, {Name: "record", Mode: 0o644, Data: []byte(`{"dir":"/home/task/src"}`)}}
	ws, err := Write(t.Context(), &archive, openDir(t, src), WriteOptions{UID: ownerUID, State: state})
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(archive.Bytes())
	if ws.ArchiveBytes != int64(archive.Len()) || ws.ArchiveSHA256 != hex.EncodeToString(sum[:]) {
		t.Errorf("Write's archive figures %d %s, the stream's %d %x", ws.ArchiveBytes, ws.ArchiveSHA256, archive.Len(), sum)
	}
	if len(ws.Changed) != 0 || ws.ForeignOwner != 0 {
		t.Errorf("a quiet tree: Changed %v, ForeignOwner %d", ws.Changed, ws.ForeignOwner)
	}
	if ws.FIFOs != 1 || ws.HardLinks != 2 || ws.Symlinks != 4 {
		t.Errorf("counts: %+v", ws)
	}
	// The sparse file's holes are not in the archive.
	if ws.DataBytes > 10<<20 {
		t.Errorf("file data archived %d bytes: the holes of the sparse files were stored", ws.DataBytes)
	}

	var gotState []StateFile
	rs, err := Read(t.Context(), bytes.NewReader(archive.Bytes()), openDir(t, dst), ReadOptions{
		UID: restoreUID, GID: restoreGID,
		State: func(s StateFile) error { gotState = append(gotState, s); return nil },
	})
	if err != nil {
		t.Fatal(err)
	}
	if rs.ArchiveSHA256 != ws.ArchiveSHA256 {
		t.Errorf("Read's digest %s, Write's %s", rs.ArchiveSHA256, ws.ArchiveSHA256)
	}
	if diff := cmp.Diff(mapOwner(want, restoreUID, restoreGID), manifest(t, dst)); diff != "" {
		t.Errorf("restored tree (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(state, gotState); diff != "" {
		t.Errorf("state (-want +got):\n%s", diff)
	}
	// Sparse files keep their holes: allocation stays near their data.
	var st unix.Stat_t
	mustRun(t, func() error { return unix.Stat(filepath.Join(dst, "sparse"), &st) })
	if st.Blocks*512 > 1<<20 {
		t.Errorf("restored sparse file allocates %d bytes for 12 KiB of data", st.Blocks*512)
	}
}

// TestArchiveReadsWithTar checks the format's claim that the archive is
// a plain pax tar in zstd: GNU tar lists every member.
func TestArchiveReadsWithTar(t *testing.T) {
	requireRoot(t)
	if _, err := exec.LookPath("tar"); err != nil {
		t.Skip("no tar on this host")
	}
	src := t.TempDir()
	buildTree(t, src)
	var archive bytes.Buffer
	if _, err := Write(t.Context(), &archive, openDir(t, src), WriteOptions{UID: ownerUID}); err != nil {
		t.Fatal(err)
	}
	// The reference decoder, where the host has it: the archive is
	// compressed in parallel jobs (more than 4 MiB of data), which must
	// still be one standard frame sequence.
	var plain []byte
	if _, err := exec.LookPath("zstd"); err == nil {
		cmd := exec.Command("zstd", "-q", "-dc")
		cmd.Stdin = bytes.NewReader(archive.Bytes())
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		if plain, err = cmd.Output(); err != nil {
			t.Fatalf("zstd -dc: %v\n%s", err, stderr.Bytes())
		}
	} else {
		zr, err := zstd.NewReader(bytes.NewReader(archive.Bytes()))
		if err != nil {
			t.Fatal(err)
		}
		if plain, err = io.ReadAll(zr); err != nil {
			t.Fatal(err)
		}
	}
	cmd := exec.Command("tar", "-tf", "-")
	cmd.Stdin = bytes.NewReader(plain)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("tar -t: %v\n%s", err, out)
	}
	for _, m := range []string{"tree/src/pkg/run.sh", "tree/link-out", "tree/empty/nested-empty/", "tree/fifo"} {
		if !strings.Contains(string(out), m+"\n") {
			t.Errorf("tar does not list %s:\n%s", m, out)
		}
	}
}

// TestWriteNeverFollowsLinks: a symbolic link to a file or directory
// outside the tree is stored as a link; the outside's content is not read.
func TestWriteNeverFollowsLinks(t *testing.T) {
	requireRoot(t)
	outside, src := t.TempDir(), t.TempDir()
	secret := "outside-secret-" + t.Name()
	mustRun(t, func() error { return os.WriteFile(filepath.Join(outside, "f"), []byte(secret), 0o600) })
	mustRun(t, func() error { return os.Symlink(outside, filepath.Join(src, "dir-link")) })
	mustRun(t, func() error { return os.Symlink(filepath.Join(outside, "f"), filepath.Join(src, "file-link")) })
	var archive bytes.Buffer
	if _, err := Write(t.Context(), &archive, openDir(t, src), WriteOptions{UID: 0}); err != nil {
		t.Fatal(err)
	}
	zr, _ := zstd.NewReader(bytes.NewReader(archive.Bytes()))
	plain, err := io.ReadAll(zr)
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(plain, []byte(secret)) {
		t.Fatal("the archive holds a file outside the tree, read through a symbolic link")
	}
	if !bytes.Contains(plain, []byte(outside)) {
		t.Error("the links' targets are not in the archive")
	}
}

// TestWriteWhileWriting: a file appended to during the snapshot is named
// in Changed; every file nobody touched comes back exactly.
func TestWriteWhileWriting(t *testing.T) {
	requireRoot(t)
	src, dst := t.TempDir(), t.TempDir()
	buildTree(t, src)
	busy := filepath.Join(src, "busy.log")
	mustRun(t, func() error { return os.WriteFile(busy, bytes.Repeat([]byte("x"), 64<<20), 0o644) })
	mustRun(t, func() error { return os.Chown(busy, ownerUID, ownerGID) })
	quiet := manifest(t, src)
	delete(quiet, "busy.log")
	delete(quiet, ".") // its time changes with busy.log? no, but keep the claim to files

	stop := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		f, err := os.OpenFile(busy, os.O_WRONLY|os.O_APPEND, 0)
		if err != nil {
			done <- err
			return
		}
		defer f.Close()
		line := []byte("appended while the snapshot runs\n")
		for {
			select {
			case <-stop:
				done <- nil
				return
			default:
			}
			if _, err := f.Write(line); err != nil {
				done <- err
				return
			}
		}
	}()
	var archive bytes.Buffer
	ws, err := Write(t.Context(), &archive, openDir(t, src), WriteOptions{UID: ownerUID})
	close(stop)
	if werr := <-done; werr != nil {
		t.Fatal(werr)
	}
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(strings.Join(ws.Changed, "\n"), "busy.log") {
		t.Errorf("busy.log changed during the snapshot, Changed = %v", ws.Changed)
	}
	if _, err := Read(t.Context(), &archive, openDir(t, dst), ReadOptions{UID: ownerUID, GID: ownerGID}); err != nil {
		t.Fatal(err)
	}
	got := manifest(t, dst)
	delete(got, "busy.log")
	delete(got, ".")
	if diff := cmp.Diff(quiet, got); diff != "" {
		t.Errorf("files nobody wrote (-want +got):\n%s", diff)
	}
}

// hostile builds an archive by hand: the global header, then members.
func hostile(t *testing.T, members ...*tar.Header) []byte {
	t.Helper()
	var b bytes.Buffer
	zw, _ := zstd.NewWriter(&b)
	tw := tar.NewWriter(zw)
	mustRun(t, func() error {
		return tw.WriteHeader(&tar.Header{Typeflag: tar.TypeXGlobalHeader, Name: "g", PAXRecords: map[string]string{paxVersion: formatVersion}, Format: tar.FormatPAX})
	})
	for _, h := range members {
		h.Format = tar.FormatPAX
		if h.Mode == 0 {
			h.Mode = 0o644
		}
		mustRun(t, func() error { return tw.WriteHeader(h) })
		if h.Typeflag == tar.TypeReg && h.Size > 0 {
			mustRun(t, func() error { _, err := tw.Write(bytes.Repeat([]byte("E"), int(h.Size))); return err })
		}
	}
	mustRun(t, func() error { return errors.Join(tw.Close(), zw.Close()) })
	return b.Bytes()
}

func TestReadRefusesEscapes(t *testing.T) {
	requireRoot(t)
	file := func(name string) *tar.Header { return &tar.Header{Typeflag: tar.TypeReg, Name: name, Size: 3} }
	cases := map[string][]*tar.Header{
		"dot-dot":             {file("tree/../escape")},
		"dot-dot inside":      {{Typeflag: tar.TypeDir, Name: "tree/a/"}, file("tree/a/../../escape")},
		"absolute":            {file("/tmp/escape")},
		"absolute in tree":    {file("tree//escape")},
		"outside the tree":    {file("escape")},
		"through a symlink":   {{Typeflag: tar.TypeSymlink, Name: "tree/l", Linkname: "OUTSIDE"}, file("tree/l/escape")},
		"through a dot link":  {{Typeflag: tar.TypeSymlink, Name: "tree/l", Linkname: ".."}, file("tree/l/escape")},
		"hard link outside":   {{Typeflag: tar.TypeLink, Name: "tree/h", Linkname: "tree/../../etc/passwd"}},
		"hard link absolute":  {{Typeflag: tar.TypeLink, Name: "tree/h", Linkname: "/etc/passwd"}},
		"hard link a symlink": {{Typeflag: tar.TypeSymlink, Name: "tree/l", Linkname: "OUTSIDE/f"}, {Typeflag: tar.TypeLink, Name: "tree/h", Linkname: "tree/l"}},
		"replace a symlink":   {{Typeflag: tar.TypeSymlink, Name: "tree/l", Linkname: "OUTSIDE/f"}, file("tree/l")},
		"device node":         {{Typeflag: tar.TypeChar, Name: "tree/null", Devmajor: 1, Devminor: 3}},
		"duplicate file":      {file("tree/a"), file("tree/a")},
		"bad sparse map": {{Typeflag: tar.TypeReg, Name: "tree/s", Size: 3, PAXRecords: map[string]string{
			paxSparseMap: "0,3,1,3", paxSparseSize: "10"}}},
		"sparse past size": {{Typeflag: tar.TypeReg, Name: "tree/s", Size: 3, PAXRecords: map[string]string{
			paxSparseMap: "100,3", paxSparseSize: "10"}}},
		"state with a path": {{Typeflag: tar.TypeReg, Name: "state/../x", Size: 3}},
	}
	for name, members := range cases {
		t.Run(name, func(t *testing.T) {
			outside, dst := t.TempDir(), t.TempDir()
			mustRun(t, func() error { return os.WriteFile(filepath.Join(outside, "f"), []byte("keep"), 0o644) })
			for _, h := range members {
				h.Linkname = strings.ReplaceAll(h.Linkname, "OUTSIDE", outside)
			}
			_, err := Read(t.Context(), bytes.NewReader(hostile(t, members...)), openDir(t, dst), ReadOptions{UID: restoreUID, GID: restoreGID})
			if err == nil {
				t.Fatal("restored a hostile archive without an error")
			}
			t.Log(err)
			if !strings.Contains(err.Error(), members[len(members)-1].Name) {
				t.Errorf("the error does not name the member %q: %v", members[len(members)-1].Name, err)
			}
			// Nothing outside the root changed.
			b, _ := os.ReadFile(filepath.Join(outside, "f"))
			if string(b) != "keep" {
				t.Errorf("a file outside the root was written: %q", b)
			}
			ents, _ := os.ReadDir(outside)
			if len(ents) != 1 {
				t.Errorf("entries appeared outside the root: %v", ents)
			}
			if _, err := os.Lstat(filepath.Join(filepath.Dir(dst), "escape")); err == nil {
				t.Error("a file was written next to the root")
			}
		})
	}
}

func TestReadRefusesForeignStreams(t *testing.T) {
	for name, data := range map[string][]byte{
		"empty":    nil,
		"not zstd": []byte("plain bytes"),
		"no version": func() []byte {
			var b bytes.Buffer
			zw, _ := zstd.NewWriter(&b)
			tw := tar.NewWriter(zw)
			tw.Close()
			zw.Close()
			return b.Bytes()
		}(),
	} {
		t.Run(name, func(t *testing.T) {
			_, err := Read(t.Context(), bytes.NewReader(data), openDir(t, t.TempDir()), ReadOptions{})
			if err == nil {
				t.Fatal("no error")
			}
		})
	}
}

// TestReadFullFileSystem fills the file system a restore writes to: the
// error is ENOSPC and names a member, whether the reader or the file pool
// met it, and the restore returns with every goroutine and file done.
func TestReadFullFileSystem(t *testing.T) {
	requireRoot(t)
	src := t.TempDir()
	for i := range 64 {
		data := bytes.Repeat([]byte{byte(i)}, 256<<10)
		mustRun(t, func() error { return os.WriteFile(filepath.Join(src, fmt.Sprintf("f%02d", i)), data, 0o644) })
	}
	mustRun(t, func() error { return os.Chown(src, ownerUID, ownerGID) })
	var archive bytes.Buffer
	if _, err := Write(t.Context(), &archive, openDir(t, src), WriteOptions{UID: ownerUID}); err != nil {
		t.Fatal(err)
	}
	dst := t.TempDir()
	// 4 MiB for 16 MiB of files.
	if err := unix.Mount("tmpfs", dst, "tmpfs", 0, "size=4m"); err != nil {
		t.Skipf("mounting a small tmpfs: %v", err)
	}
	t.Cleanup(func() { _ = unix.Unmount(dst, unix.MNT_DETACH) })
	_, err := Read(t.Context(), bytes.NewReader(archive.Bytes()), openDir(t, dst), ReadOptions{UID: restoreUID, GID: restoreGID})
	if !errors.Is(err, unix.ENOSPC) || !strings.Contains(err.Error(), `member "tree/f`) {
		t.Fatalf("restore into a full file system: %v; want ENOSPC naming a member", err)
	}
}

// TestConcurrentWrites runs snapshots at once: one compresses in parallel
// jobs (parallelWrites), the others one block at a time, and every
// archive restores the same tree.
func TestConcurrentWrites(t *testing.T) {
	requireRoot(t)
	src := t.TempDir()
	buildTree(t, src)
	want := mapOwner(manifest(t, src), restoreUID, restoreGID)
	archives := make([]bytes.Buffer, 3)
	errs := make(chan error, len(archives))
	for i := range archives {
		go func() {
			root, err := os.Open(src)
			if err != nil {
				errs <- err
				return
			}
			defer root.Close()
			_, err = Write(t.Context(), &archives[i], root, WriteOptions{UID: ownerUID, Concurrency: 2})
			errs <- err
		}()
	}
	for range archives {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	for i := range archives {
		dst := t.TempDir()
		if _, err := Read(t.Context(), bytes.NewReader(archives[i].Bytes()), openDir(t, dst), ReadOptions{UID: restoreUID, GID: restoreGID}); err != nil {
			t.Fatalf("archive %d: %v", i, err)
		}
		if diff := cmp.Diff(want, manifest(t, dst)); diff != "" {
			t.Errorf("archive %d restored (-want +got):\n%s", i, diff)
		}
	}
	if len(parallelWrites) != 0 {
		t.Errorf("%d parallel tokens still held after every Write returned", len(parallelWrites))
	}
}

// TestReadChownFailsNoSetID restores set-ID files where the chown to the
// workspace's UID fails (a user namespace that does not map it): the
// restore fails naming the member, and no file is left root's with its
// set-ID bits, for a file of the pool and one streamed.
func TestReadChownFailsNoSetID(t *testing.T) {
	requireRoot(t)
	if dst := os.Getenv("SNAPSHOT_TEST_CHOWN_DST"); dst != "" {
		// In the user namespace, where only UID 0 is mapped.
		for _, h := range []*tar.Header{
			{Typeflag: tar.TypeReg, Name: "tree/small", Mode: 0o6755, Size: 10},
			{Typeflag: tar.TypeReg, Name: "tree/large", Mode: 0o6755, Size: 2 << 20},
		} {
			a := hostile(t, &tar.Header{Typeflag: tar.TypeDir, Name: "tree/", Mode: 0o700}, h)
			sub := filepath.Join(dst, path.Base(h.Name)+".d")
			mustRun(t, func() error { return os.Mkdir(sub, 0o755) })
			_, err := Read(t.Context(), bytes.NewReader(a), openDir(t, sub), ReadOptions{UID: restoreUID, GID: restoreGID})
			if err == nil || !strings.Contains(err.Error(), h.Name) {
				t.Errorf("%s: the restore's error %v; want one naming the member", h.Name, err)
			}
		}
		return
	}
	if _, err := exec.LookPath("unshare"); err != nil {
		t.Skip("no unshare on this host")
	}
	dst := t.TempDir()
	cmd := exec.Command("unshare", "--user", "--map-root-user", os.Args[0], "-test.run=^TestReadChownFailsNoSetID$")
	cmd.Env = append(os.Environ(), "SNAPSHOT_TEST_CHOWN_DST="+dst)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("the restore in a user namespace: %v\n%s", err, out)
	}
	for _, n := range []string{"small.d/small", "large.d/large"} {
		var st unix.Stat_t
		if err := unix.Stat(filepath.Join(dst, n), &st); err != nil {
			continue // removed or never made: nothing left behind
		}
		if st.Mode&(unix.S_ISUID|unix.S_ISGID) != 0 {
			t.Errorf("%s: left with owner %d and mode %o after the chown failed", n, st.Uid, st.Mode&0o7777)
		}
	}
}

// TestRoundTripOverlayUpper snapshots the upper directory of a real
// overlay mount in which a file of the lower layer was deleted (a
// whiteout), a directory of it replaced (opaque), a set-user-ID file
// and a file in a new directory were written, restores it into a new
// upper directory, and mounts that over the same lower layer: the
// merged view is the same, and the work directory was never archived.
func TestRoundTripOverlayUpper(t *testing.T) {
	requireRoot(t)
	base := t.TempDir()
	lower, upper, work, merged := filepath.Join(base, "lower"), filepath.Join(base, "upper"), filepath.Join(base, "work"), filepath.Join(base, "merged")
	for _, d := range []string{lower + "/usr/bin", lower + "/opt/old", upper, work, merged} {
		mustRun(t, func() error { return os.MkdirAll(d, 0o755) })
	}
	mustRun(t, func() error { return os.WriteFile(lower+"/usr/bin/gone", []byte("image file"), 0o755) })
	mustRun(t, func() error { return os.WriteFile(lower+"/opt/old/file", []byte("old"), 0o644) })
	mount := func(up, wk string) {
		t.Helper()
		opts := "lowerdir=" + lower + ",upperdir=" + up + ",workdir=" + wk
		if err := unix.Mount("overlay", merged, "overlay", 0, opts); err != nil {
			testutil.SkipUnlessStrictf(t, "no overlay mount here: %v", err)
		}
	}
	mount(upper, work)
	mustRun(t, func() error { return os.Remove(merged + "/usr/bin/gone") })
	mustRun(t, func() error { return os.RemoveAll(merged + "/opt") })
	mustRun(t, func() error { return os.MkdirAll(merged+"/opt/new", 0o755) })
	mustRun(t, func() error { return os.MkdirAll(merged+"/etc", 0o755) })
	mustRun(t, func() error { return os.WriteFile(merged+"/etc/motd", []byte("persisted"), 0o644) })
	mustRun(t, func() error { return os.WriteFile(merged+"/usr/bin/suid", []byte("#!/bin/sh\n"), 0o755) })
	mustRun(t, func() error { return unix.Chmod(merged+"/usr/bin/suid", 0o4755) })
	mustRun(t, func() error { return unix.Unmount(merged, 0) })

	want := manifest(t, upper)
	if want["usr/bin/gone"].Kind != "other" {
		t.Fatalf("the kernel left no whiteout for the deleted file: %+v", want["usr/bin/gone"])
	}
	var archive bytes.Buffer
	ws, err := Write(t.Context(), &archive, openDir(t, t.TempDir()), WriteOptions{UID: 0, Upper: openDir(t, upper)})
	if err != nil {
		t.Fatal(err)
	}
	if ws.Whiteouts != 1 || ws.OpaqueDirs != 1 || len(ws.Skipped) != 0 {
		t.Errorf("Write: %d whiteouts, %d opaque directories, skipped %v; want 1, 1, none", ws.Whiteouts, ws.OpaqueDirs, ws.Skipped)
	}
	upper2, work2 := filepath.Join(base, "upper2"), filepath.Join(base, "work2")
	mustRun(t, func() error { return os.Mkdir(upper2, 0o755) })
	mustRun(t, func() error { return os.Mkdir(work2, 0o755) })
	rs, err := Read(t.Context(), bytes.NewReader(archive.Bytes()), openDir(t, t.TempDir()), ReadOptions{
		Upper: func() (*os.File, error) { return os.Open(upper2) },
	})
	if err != nil {
		t.Fatal(err)
	}
	if rs.Whiteouts != 1 || rs.OpaqueDirs != 1 {
		t.Errorf("Read: %d whiteouts, %d opaque directories; want 1 and 1", rs.Whiteouts, rs.OpaqueDirs)
	}
	if diff := cmp.Diff(mapOwner(want, 0, 0), manifest(t, upper2)); diff != "" {
		t.Errorf("restored upper directory (-want +got):\n%s", diff)
	}
	mount(upper2, work2)
	t.Cleanup(func() { _ = unix.Unmount(merged, unix.MNT_DETACH) })
	if _, err := os.Lstat(merged + "/usr/bin/gone"); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the deleted image file is back after the restore: %v", err)
	}
	if ents, err := os.ReadDir(merged + "/opt"); err != nil || len(ents) != 1 || ents[0].Name() != "new" {
		t.Errorf("the replaced directory shows %v (%v), want only new: it is not opaque", ents, err)
	}
	if b, err := os.ReadFile(merged + "/etc/motd"); err != nil || string(b) != "persisted" {
		t.Errorf("etc/motd: %q, %v", b, err)
	}
	if fi, err := os.Stat(merged + "/usr/bin/suid"); err != nil || fi.Mode()&os.ModeSetuid == 0 {
		t.Errorf("the set-user-ID file lost its bit: %v, %v", fi, err)
	}
}

// TestReadRefusesDevicesOutsideUpper: a character device is a whiteout
// of the upper directory only; in the workspace's tree, or other than
// 0/0, it is refused, as is the opaque attribute on a tree directory.
func TestReadRefusesDevicesOutsideUpper(t *testing.T) {
	requireRoot(t)
	for name, h := range map[string]*tar.Header{
		"tree device":   {Typeflag: tar.TypeChar, Name: "tree/null", Mode: 0o666},
		"upper device":  {Typeflag: tar.TypeChar, Name: "upper/mem", Devmajor: 1, Devminor: 1, Mode: 0o666},
		"tree opaque":   {Typeflag: tar.TypeDir, Name: "tree/d/", Mode: 0o755, PAXRecords: map[string]string{paxOpaque: "y"}},
		"upper escapes": {Typeflag: tar.TypeReg, Name: "upper/../x", Mode: 0o644},
	} {
		upper := t.TempDir()
		_, err := Read(t.Context(), bytes.NewReader(hostile(t, h)), openDir(t, t.TempDir()), ReadOptions{
			Upper: func() (*os.File, error) { return os.Open(upper) },
		})
		if !errors.Is(err, ErrFormat) {
			t.Errorf("%s: %v, want ErrFormat", name, err)
		}
	}
}
