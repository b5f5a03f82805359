//go:build linux

package executor

import (
	"bytes"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"path/filepath"
	"strconv"

	"golang.org/x/sys/unix"
)

// The default-size file systems are copies of one template: mkfs.ext4 is
// a process of its own, with about 10 ms of CPU on every run, where
// copying the few hundred KiB of metadata it writes into a sparse file takes the
// kernel a fraction of that (docs/performance.md, "The tenant level's
// CPU per task"). Each copy gets a UUID and a directory hash seed of its
// own, so that it is what mkfs.ext4 would have made: nothing of the
// template is shared but its layout, and the template itself is never
// mounted.

// templateName is the template's file in the image directory; it ends
// in .img, so that SweepDiskImages removes one an earlier executor left.
const templateName = "template.img"

// ext4 superblock layout (the kernel's struct ext4_super_block): the
// superblock is at byte 1024 of the image and 1024 bytes long.
const (
	ext4SuperOffset      = 1024
	ext4SuperSize        = 1024
	ext4MagicOffset      = 0x38
	ext4Magic            = 0xEF53
	ext4IncompatOffset   = 0x60
	ext4ROCompatOffset   = 0x64
	ext4UUIDOffset       = 0x68
	ext4HashSeedOffset   = 0xEC
	ext4ChecksumOffset   = 0x3FC
	ext4IncompatCsumSeed = 0x2000 // INCOMPAT_CSUM_SEED: checksums seeded by s_checksum_seed, not the UUID
	ext4ROCompatCsum     = 0x400  // RO_COMPAT_METADATA_CSUM
)

// mkfsArgs are mkfs.ext4's arguments for an image of size bytes with at
// most inodes inodes. No journal: the file system never outlives its
// task or a crash of the node (the executor removes every image at
// start). No reserved blocks for root: the task is the only user.
// lazy_itable_init with the noinit_itable mount option: the sparse file
// reads as zeros, so the inode tables need no writing, neither now nor in
// the kernel's background thread later. metadata_csum_seed: the
// checksums do not depend on the UUID, which each copy of the template
// changes ([freshenSuper]). No resize inode: nothing grows the file
// system, and its reserved blocks of group descriptors were most of what
// mkfs.ext4 wrote (4 MiB of a 10Gi image against 0.2 MiB without), data
// every copy would repeat.
func mkfsArgs(image string, size, inodes int64) []string {
	// Whole blocks of 4 KiB; at most one inode per block (ext4's limit).
	inodes = min(inodes, size/4096)
	return []string{"-q", "-F", "-t", "ext4", "-O", "^has_journal,^resize_inode,metadata_csum_seed", "-m", "0",
		"-b", "4096", "-N", strconv.FormatInt(inodes, 10), "-E", "lazy_itable_init=1,nodiscard", image}
}

// mkfs creates the sparse image file image (which must not exist) of
// size bytes with an ext4 file system and returns it open.
func (q *diskQuota) mkfs(image string, size int64) (_ *os.File, err error) {
	img, err := os.OpenFile(image, os.O_RDWR|os.O_CREATE|os.O_EXCL|unix.O_NOFOLLOW, 0o600)
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			img.Close()
		}
	}()
	if err := img.Truncate(size); err != nil {
		return nil, fmt.Errorf("sizing %s: %w", image, err)
	}
	out, err := runHelper(q.mkfsPath, mkfsArgs(image, size, q.inodes)...)
	if err != nil {
		return nil, fmt.Errorf("mkfs.ext4 %s: %w: %s", image, err, bytes.TrimSpace(out))
	}
	return img, nil
}

// makeTemplate makes the template of the default-size file systems. It
// checks that the superblock can be given a UUID of its own per copy;
// where it cannot (an mkfs.ext4 without metadata_csum_seed) every file
// system is made by mkfs.ext4 as before.
func (q *diskQuota) makeTemplate() error {
	image := filepath.Join(q.imageDir, templateName)
	img, err := q.mkfs(image, q.defBytes)
	if err != nil {
		return err
	}
	defer img.Close()
	sb := make([]byte, ext4SuperSize)
	if _, err := img.ReadAt(sb, ext4SuperOffset); err != nil {
		return fmt.Errorf("reading the superblock of %s: %w", image, err)
	}
	if checkSuper(sb) != nil {
		// mkfs.ext4 per file system, as without a template.
		return os.Remove(image)
	}
	q.template = image
	return nil
}

// checkSuper reports whether sb is an ext4 superblock whose UUID can
// change without rewriting the metadata's checksums.
func checkSuper(sb []byte) error {
	if binary.LittleEndian.Uint16(sb[ext4MagicOffset:]) != ext4Magic {
		return errors.New("not an ext4 superblock")
	}
	if binary.LittleEndian.Uint32(sb[ext4IncompatOffset:])&ext4IncompatCsumSeed == 0 {
		return errors.New("no metadata_csum_seed: the checksums depend on the UUID")
	}
	return nil
}

// copyTemplate fills dst, a new empty image file, with a copy of the
// template: its size, its data where it has data (the kernel copies,
// copy_file_range), holes elsewhere; then it gives the copy a UUID and a
// hash seed of its own.
func (q *diskQuota) copyTemplate(dst *os.File) error {
	src, err := os.Open(q.template)
	if err != nil {
		return err
	}
	defer src.Close()
	fi, err := src.Stat()
	if err != nil {
		return err
	}
	if err := dst.Truncate(fi.Size()); err != nil {
		return fmt.Errorf("sizing %s: %w", dst.Name(), err)
	}
	if err := copyData(src, dst, fi.Size()); err != nil {
		return fmt.Errorf("copying %s to %s: %w", q.template, dst.Name(), err)
	}
	return freshenSuper(dst)
}

// copyData copies the data extents of src (SEEK_DATA, SEEK_HOLE) of size
// bytes to the same offsets of dst, leaving its holes.
func copyData(src, dst *os.File, size int64) error {
	for off := int64(0); off < size; {
		data, err := unix.Seek(int(src.Fd()), off, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) {
			return nil // no data past off
		}
		if err != nil {
			return err
		}
		hole, err := unix.Seek(int(src.Fd()), data, unix.SEEK_HOLE)
		if err != nil {
			return err
		}
		for in, out := data, data; in < hole; {
			n, err := unix.CopyFileRange(int(src.Fd()), &in, int(dst.Fd()), &out, int(hole-in), 0)
			if err != nil {
				return err
			}
			if n == 0 {
				return io.ErrUnexpectedEOF
			}
		}
		off = hole
	}
	return nil
}

// freshenSuper gives the file system of img a new random UUID and
// directory hash seed, and the superblock its checksum again.
func freshenSuper(img *os.File) error {
	sb := make([]byte, ext4SuperSize)
	if _, err := img.ReadAt(sb, ext4SuperOffset); err != nil {
		return fmt.Errorf("reading the superblock of %s: %w", img.Name(), err)
	}
	if err := checkSuper(sb); err != nil {
		return fmt.Errorf("%s: %w", img.Name(), err)
	}
	for _, off := range []int{ext4UUIDOffset, ext4HashSeedOffset} {
		uuid := sb[off : off+16]
		if _, err := rand.Read(uuid); err != nil {
			return err
		}
		uuid[6] = uuid[6]&0x0f | 0x40 // version 4
		uuid[8] = uuid[8]&0x3f | 0x80 // RFC 4122 variant
	}
	if binary.LittleEndian.Uint32(sb[ext4ROCompatOffset:])&ext4ROCompatCsum != 0 {
		binary.LittleEndian.PutUint32(sb[ext4ChecksumOffset:], superChecksum(sb))
	}
	if _, err := img.WriteAt(sb, ext4SuperOffset); err != nil {
		return fmt.Errorf("writing the superblock of %s: %w", img.Name(), err)
	}
	return nil
}

// superChecksum is the kernel's ext4_superblock_csum: CRC32C seeded with
// all ones over the superblock up to its checksum field, without the
// final inversion.
func superChecksum(sb []byte) uint32 {
	return ^crc32.Checksum(sb[:ext4ChecksumOffset], crc32.MakeTable(crc32.Castagnoli))
}
