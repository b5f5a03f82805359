//go:build linux

package executor

import (
	"bufio"
	"cmp"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// loopAttachAttempts bounds the tries to attach a workspace's or task's
// file system to a free loop device, each lost to another process that
// took the same free device first (EBUSY from LOOP_CONFIGURE).
const loopAttachAttempts = 64

// diskQuota gives each fresh working directory at IsolationTenant a file
// system of its own with a size and an inode limit: an ext4 image, a
// sparse file in the executor's image directory (no disk is used until
// the task writes), attached to a loop device and mounted at the working
// directory. A write past either limit fails with ENOSPC in that task
// alone; the node's disk, the spill files and the other tasks keep their
// room.
//
// Why ext4 on a loop device: the kernels in use lack CONFIG_QUOTA, so
// ext4 and XFS project quotas are not there; btrfs qgroups would need a
// btrfs of the executor's own and have no inode limit. mkfs.ext4 and the
// mount cost tens of milliseconds, so file systems of the default size
// are made ahead of their tasks (a pool, as for shims) and a start takes
// one ready-made; a task that asks for another size pays for its own.
type diskQuota struct {
	imageDir string // the images, 0700, the executor's own
	workRoot string // where the working directories (mount points) are
	defBytes int64
	capBytes int64
	inodes   int64
	mkfsPath string
	loopCtl  string // /dev/loop-control
	// template is the file system of defBytes the others of that size
	// are copies of (quota_template_linux.go); "" where each is made by
	// mkfs.ext4.
	template string

	pool chan *quotaFS // ready file systems of defBytes
	stop chan struct{}
	wg   sync.WaitGroup
}

// quotaFS is one mounted image: dir is its mount point, the task's
// working directory.
type quotaFS struct {
	dir   string
	image string
	q     *diskQuota
}

// Quota defaults ([Config.DiskQuotaBytes] and the others).
const (
	// DefaultDiskQuotaInodes is the inode limit of a task's working
	// directory (files, directories and links): room for a large source
	// tree with its dependencies.
	DefaultDiskQuotaInodes = 1 << 20
	// MinDiskQuotaBytes is the smallest working directory file system:
	// ext4 needs a few MiB of its own for its metadata.
	MinDiskQuotaBytes = 32 << 20
	// diskPoolSize is how many default-size file systems are kept ready.
	diskPoolSize = 2
)

// newDiskQuota checks the configuration, removes what an earlier executor
// left in imageDir (mounts of its images, the images) and makes the first
// file system, the probe of the mechanism: when the node cannot (no loop
// devices, no mkfs.ext4, no ext4) it returns the reason and no diskQuota.
func newDiskQuota(cfg Config, workRoot string) (*diskQuota, error) {
	q := &diskQuota{
		imageDir: cfg.DiskImageDir,
		workRoot: workRoot,
		defBytes: cfg.DiskQuotaBytes,
		capBytes: cfg.DiskQuotaCapBytes,
		inodes:   cfg.DiskQuotaInodes,
		loopCtl:  cmp.Or(cfg.loopControl, "/dev/loop-control"),
		stop:     make(chan struct{}),
		pool:     make(chan *quotaFS, diskPoolSize),
	}
	if q.inodes == 0 {
		q.inodes = DefaultDiskQuotaInodes
	}
	if q.capBytes == 0 {
		q.capBytes = q.defBytes
	}
	switch {
	case q.imageDir == "" || !filepath.IsAbs(q.imageDir):
		return nil, fmt.Errorf("%w: disk image directory %q is not an absolute path", ErrInvalidConfig, q.imageDir)
	case q.defBytes < MinDiskQuotaBytes || q.capBytes < q.defBytes:
		return nil, fmt.Errorf("%w: disk quota %d bytes (cap %d): want at least %d and a cap not below it", ErrInvalidConfig, q.defBytes, q.capBytes, MinDiskQuotaBytes)
	case q.inodes < 16:
		return nil, fmt.Errorf("%w: disk inode limit %d is below 16", ErrInvalidConfig, q.inodes)
	}
	if err := os.MkdirAll(q.imageDir, 0o700); err != nil {
		return nil, fmt.Errorf("%w: disk image directory: %w", ErrInvalidConfig, err)
	}
	if err := SweepDiskImages(q.imageDir); err != nil {
		return nil, fmt.Errorf("removing the file systems of an earlier executor: %w", err)
	}
	var err error
	if q.mkfsPath, err = exec.LookPath(cmp.Or(cfg.mkfs, "mkfs.ext4")); err != nil {
		return nil, errNoQuota(fmt.Errorf("no mkfs.ext4 (e2fsprogs): %w", err))
	}
	if err := q.makeTemplate(); err != nil {
		return nil, errNoQuota(err)
	}
	first, err := q.make(q.defBytes)
	if err != nil {
		return nil, errNoQuota(err)
	}
	q.pool <- first
	q.wg.Add(1)
	go q.fill()
	return q, nil
}

// errNoQuota marks a node that cannot enforce the quota: New degrades
// instead of failing.
type errNoQuota error

// fill keeps the pool full until stop.
func (q *diskQuota) fill() {
	defer q.wg.Done()
	for {
		select {
		case <-q.stop:
			return
		default:
		}
		fs, err := q.make(q.defBytes)
		if err != nil {
			// A full disk or no free loop device: tasks make their own
			// (and fail with the reason) until the pool refills.
			retry := time.NewTimer(time.Second)
			select {
			case <-q.stop:
				retry.Stop()
				return
			case <-retry.C:
			}
			continue
		}
		select {
		case q.pool <- fs:
		case <-q.stop:
			_ = fs.remove()
			return
		}
	}
}

// take returns a mounted file system of size bytes for a task: a
// ready-made one of the default size, or one made now.
func (q *diskQuota) take(size int64) (*quotaFS, error) {
	if size == 0 || size == q.defBytes {
		select {
		case fs := <-q.pool:
			return fs, nil
		default:
		}
		size = q.defBytes
	}
	return q.make(size)
}

// close stops the filler and removes the file systems it made.
func (q *diskQuota) close() {
	close(q.stop)
	q.wg.Wait()
	for {
		select {
		case fs := <-q.pool:
			_ = fs.remove()
		default:
			return
		}
	}
}

// make creates, attaches and mounts a file system of size bytes at a
// fresh directory under workRoot.
func (q *diskQuota) make(size int64) (_ *quotaFS, err error) {
	dir, err := os.MkdirTemp(q.workRoot, "bashtask-work-")
	if err != nil {
		return nil, err
	}
	fs := &quotaFS{dir: dir, image: filepath.Join(q.imageDir, filepath.Base(dir)+".img"), q: q}
	if err := q.makeImageFS(fs.image, dir, size); err != nil {
		_ = fs.remove()
		return nil, err
	}
	return fs, nil
}

// makeImageFS creates the sparse image file image (which must not
// exist) of size bytes with an ext4 file system of at most q.inodes
// inodes, a copy of the template for the default size, and mounts it at
// the existing directory dir (mountImage). On error the caller removes
// what is left (the image, a mount at dir).
func (q *diskQuota) makeImageFS(image, dir string, size int64) error {
	img, err := q.newImage(image, size)
	if err != nil {
		return err
	}
	defer img.Close()
	if err := mountImage(q.loopCtl, img, dir); err != nil {
		return err
	}
	// A task sees its working directory empty, as without a quota.
	if err := unix.Rmdir(filepath.Join(dir, "lost+found")); err != nil && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("removing lost+found of %s: %w", dir, err)
	}
	return nil
}

// newImage creates the image file image of size bytes with its file
// system, a copy of the template where there is one of that size, and
// returns it open.
func (q *diskQuota) newImage(image string, size int64) (*os.File, error) {
	if q.template == "" || size != q.defBytes {
		return q.mkfs(image, size)
	}
	img, err := os.OpenFile(image, os.O_RDWR|os.O_CREATE|os.O_EXCL|unix.O_NOFOLLOW, 0o600)
	if err != nil {
		return nil, err
	}
	if err := q.copyTemplate(img); err != nil {
		img.Close()
		return nil, err
	}
	return img, nil
}

// mountImage attaches the open image img to a free loop device and
// mounts its ext4 file system at dir, nosuid and nodev. The loop device
// clears itself (LO_FLAGS_AUTOCLEAR) once the file system is unmounted:
// nothing but the mount holds it.
func mountImage(loopCtl string, img *os.File, dir string) error {
	dev, err := attachLoop(loopCtl, img)
	if err != nil {
		return err
	}
	defer dev.Close()
	if err := unix.Mount(dev.Name(), dir, "ext4", unix.MS_NOSUID|unix.MS_NODEV, "noinit_itable"); err != nil {
		return fmt.Errorf("mounting %s (%s) at %s: %w", dev.Name(), img.Name(), dir, err)
	}
	return nil
}

// attachLoop attaches img to a free loop device (LOOP_CTL_GET_FREE, then
// LOOP_CONFIGURE, retried when another process took the same device) and
// returns the device, open.
func attachLoop(control string, img *os.File) (*os.File, error) {
	ctl, err := os.OpenFile(control, os.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("loop devices: %w", err)
	}
	defer ctl.Close()
	for attempt := range loopAttachAttempts {
		if attempt > 0 {
			// LOOP_CTL_GET_FREE gives every concurrent caller the same
			// device: stagger the retries so that a burst of starts
			// spreads over the devices instead of colliding again.
			time.Sleep(time.Duration(rand.Int64N(int64(attempt)*int64(200*time.Microsecond)) + 1))
		}
		n, err := unix.IoctlRetInt(int(ctl.Fd()), unix.LOOP_CTL_GET_FREE)
		if err != nil {
			return nil, fmt.Errorf("finding a free loop device: %w", err)
		}
		path := "/dev/loop" + strconv.Itoa(n)
		dev, err := os.OpenFile(path, os.O_RDWR|unix.O_CLOEXEC, 0)
		if errors.Is(err, os.ErrNotExist) {
			// A container's /dev holds the devices of its start; one
			// created since has no node there yet.
			if err = unix.Mknod(path, unix.S_IFBLK|0o600, int(unix.Mkdev(7, uint32(n)))); err == nil || errors.Is(err, os.ErrExist) {
				dev, err = os.OpenFile(path, os.O_RDWR|unix.O_CLOEXEC, 0)
			}
		}
		if err != nil {
			return nil, fmt.Errorf("opening %s: %w", path, err)
		}
		cfg := unix.LoopConfig{Fd: uint32(img.Fd())}
		cfg.Info.Flags = unix.LO_FLAGS_AUTOCLEAR
		copy(cfg.Info.File_name[:], img.Name())
		err = unix.IoctlLoopConfigure(int(dev.Fd()), &cfg)
		if errors.Is(err, unix.EBUSY) {
			dev.Close()
			continue
		}
		if err != nil {
			dev.Close()
			return nil, fmt.Errorf("attaching %s to %s: %w", img.Name(), path, err)
		}
		return dev, nil
	}
	return nil, fmt.Errorf("attaching a loop device: every free device was taken by another process first, %d times", loopAttachAttempts)
}

// retire ends a task's use of the file system: its root goes back to root
// with mode 0700 now, so that no later task of the same UID (the lease is
// returned once this returns) can enter it, and the unmount, which makes
// ext4 shut down (tens of milliseconds for a 10Gi file system), and the
// image's removal follow in the background, off the task's end. A removal
// that fails leaves an image that the next executor's sweep removes.
func (fs *quotaFS) retire() error {
	if err := os.Lchown(fs.dir, 0, 0); err != nil {
		return fmt.Errorf("taking back %s: %w", fs.dir, err)
	}
	if err := os.Chmod(fs.dir, 0o700); err != nil {
		return fmt.Errorf("taking back %s: %w", fs.dir, err)
	}
	fs.q.wg.Add(1)
	go func() {
		defer fs.q.wg.Done()
		_ = fs.remove()
	}()
	return nil
}

// remove unmounts the file system, deletes its image and its mount point.
// It never walks the task's files: once unmounted, the mount point is an
// empty directory of the executor's, and what the task wrote goes with
// the image.
func (fs *quotaFS) remove() error {
	var errs []error
	// MNT_DETACH: a mount namespace of the task's that is still being
	// torn down keeps its own reference; the loop device clears itself
	// when the last one goes.
	if err := unix.Unmount(fs.dir, unix.MNT_DETACH|unix.UMOUNT_NOFOLLOW); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
		errs = append(errs, fmt.Errorf("unmounting %s: %w", fs.dir, err))
	}
	if err := os.Remove(fs.image); err != nil && !errors.Is(err, os.ErrNotExist) {
		errs = append(errs, err)
	}
	if err := unix.Rmdir(fs.dir); err != nil && !errors.Is(err, unix.ENOENT) {
		errs = append(errs, fmt.Errorf("removing %s: %w", fs.dir, err))
	}
	return errors.Join(errs...)
}

// SweepDiskImages removes what an executor left in its disk image
// directory dir: it unmounts every mount in this mount namespace whose
// loop device's backing file lies in dir (read from
// /sys/block/loopN/loop/backing_file), removes those mount points when
// empty, and deletes every image. The agent calls it (through [New])
// before its recovery removes earlier tasks' working directories, which
// are then plain empty directories.
func SweepDiskImages(dir string) error {
	var errs []error
	mounts, err := loopMounts()
	if err != nil {
		return err
	}
	for _, m := range mounts {
		backing, err := os.ReadFile("/sys/block/" + filepath.Base(m.dev) + "/loop/backing_file")
		if err != nil {
			continue // not a loop device, or cleared meanwhile
		}
		file := strings.TrimSuffix(strings.TrimSpace(string(backing)), " (deleted)")
		if filepath.Dir(file) != dir {
			continue
		}
		if err := unix.Unmount(m.point, unix.MNT_DETACH|unix.UMOUNT_NOFOLLOW); err != nil && !errors.Is(err, unix.EINVAL) {
			errs = append(errs, fmt.Errorf("unmounting %s: %w", m.point, err))
			continue
		}
		_ = unix.Rmdir(m.point) // an earlier task's: the agent's recovery removes it if this does not
	}
	images, err := filepath.Glob(filepath.Join(dir, "*.img"))
	if err != nil {
		return err
	}
	for _, img := range images {
		if err := os.Remove(img); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

type mountEntry struct{ dev, point string }

// loopMounts lists the mounts of /dev/loop devices in this mount
// namespace, from /proc/self/mountinfo.
func loopMounts() ([]mountEntry, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []mountEntry
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		// id parent major:minor root point options [optional...] - type source superoptions
		pre, post, ok := strings.Cut(sc.Text(), " - ")
		fields, tail := strings.Fields(pre), strings.Fields(post)
		if !ok || len(fields) < 5 || len(tail) < 2 || !strings.HasPrefix(tail[1], "/dev/loop") {
			continue
		}
		out = append(out, mountEntry{dev: tail[1], point: unescapeMountinfo(fields[4])})
	}
	return out, sc.Err()
}

// unescapeMountinfo undoes the octal escapes (\040 for a space) of a
// mountinfo path.
func unescapeMountinfo(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if v, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// setupDiskQuota sets up the disk quota of cfg at IsolationTenant. A node
// that cannot enforce it is not an error: the executor runs without,
// Capabilities says so, and each task's Result names the limit as not
// enforced.
func (e *Executor) setupDiskQuota(cfg Config) error {
	if cfg.DiskQuotaBytes == 0 || e.isolation != IsolationTenant {
		return nil
	}
	e.quotaWanted = true
	e.quotaCap = cmp.Or(cfg.DiskQuotaCapBytes, cfg.DiskQuotaBytes)
	q, err := newDiskQuota(cfg, e.workRoot)
	var no errNoQuota
	switch {
	case errors.As(err, &no):
		e.quotaReason = err.Error()
		return nil
	case err != nil:
		return err
	}
	e.quota = q
	return nil
}
