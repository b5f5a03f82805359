//go:build linux

package snapshot

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// The restore's file pool: the reader creates every entry itself, in the
// archive's order, and hands a small regular file, already created and
// open, with its data to a pool of goroutines that write the data and set
// the owner, mode and modification time. Creating in order keeps every
// name check and error where it was (a hard link finds its target, made
// before it, at once); writing in parallel spreads the file system's
// per-file work (allocation, the journalled attribute changes, and the
// waits for dirty-page write-back) over the node's cores, which is most
// of a restore of many small files.
const (
	// poolFileBytes is the largest member, in bytes (1 MiB), that goes to
	// the pool; a larger one is written by the reader as it streams.
	poolFileBytes = 1 << 20
	// poolBuffers is how many member buffers of poolFileBytes the pool
	// has, which bounds the data held in flight (16 MiB).
	poolBuffers = 16
	// maxPoolWorkers bounds the pool's goroutines.
	maxPoolWorkers = 8
)

// fileJob is one created, open file for the pool to complete. The pool
// closes fd.
type fileJob struct {
	fd     int
	member string
	ranges []dataRange
	size   int64  // the file's size, holes included
	data   []byte // the ranges' bytes back to back; a pool buffer
	mode   uint32
	mtime  time.Time
}

// filePool completes fileJobs on goroutines of its own.
type filePool struct {
	uid, gid int
	jobs     chan fileJob
	free     chan []byte
	wg       sync.WaitGroup
	stop     sync.Once

	mu    sync.Mutex
	first error
}

// newFilePool starts a pool of min(GOMAXPROCS, maxPoolWorkers)
// goroutines owning files for uid and gid.
func newFilePool(uid, gid uint32) *filePool {
	p := &filePool{uid: int(uid), gid: int(gid), jobs: make(chan fileJob, poolBuffers), free: make(chan []byte, poolBuffers)}
	for range poolBuffers {
		p.free <- make([]byte, poolFileBytes)
	}
	n := min(runtime.GOMAXPROCS(0), maxPoolWorkers)
	p.wg.Add(n)
	for range n {
		go p.work()
	}
	return p
}

// buffer returns a buffer of poolFileBytes, waiting for one to be free,
// or ctx's error.
func (p *filePool) buffer(ctx context.Context) ([]byte, error) {
	select {
	case b := <-p.free:
		return b, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// release returns a buffer that was not submitted.
func (p *filePool) release(b []byte) { p.free <- b[:cap(b)] }

// submit hands j to the pool, which owns j.fd and j.data from then on.
func (p *filePool) submit(j fileJob) { p.jobs <- j }

// err returns the first error a job met, or nil.
func (p *filePool) err() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.first
}

// wait completes the jobs submitted, stops the pool and returns the first
// error a job met. Nothing is submitted after the first call; later calls
// return the same error.
func (p *filePool) wait() error {
	p.stop.Do(func() {
		close(p.jobs)
		p.wg.Wait()
	})
	return p.err()
}

func (p *filePool) work() {
	defer p.wg.Done()
	for j := range p.jobs {
		var err error
		if p.err() == nil {
			err = completeFile(j.fd, j.member, j.ranges, j.data, j.size, p.uid, p.gid, j.mode, j.mtime)
		}
		if cerr := unix.Close(j.fd); err == nil && cerr != nil {
			err = fmt.Errorf("snapshot: member %q: %w", j.member, cerr)
		}
		p.release(j.data)
		if err != nil {
			p.mu.Lock()
			if p.first == nil {
				p.first = err
			}
			p.mu.Unlock()
		}
	}
}

// completeFile writes data (the ranges' bytes back to back; nil when the
// caller wrote them) into the open file fd, sets its size when it ends in
// a hole, then its owner, its mode (after the owner: a chown clears the
// set-user-ID bits) and its modification time. Errors name the member.
func completeFile(fd int, member string, ranges []dataRange, data []byte, size int64, uid, gid int, mode uint32, mtime time.Time) error {
	end := int64(0)
	for _, r := range ranges {
		if data != nil {
			if err := pwriteFull(fd, data[:r.len], r.off); err != nil {
				return fmt.Errorf("snapshot: member %q: %w", member, err)
			}
			data = data[r.len:]
		}
		end = r.off + r.len
	}
	// Only a file that ends in a hole needs its size set: a truncate to
	// the size it has already costs ext4 a journalled attribute change.
	if end < size {
		if err := unix.Ftruncate(fd, size); err != nil {
			return fmt.Errorf("snapshot: member %q: %w", member, err)
		}
	}
	// The mode only after the owner is the workspace's: a file left
	// root's by a failed chown never gets set-ID bits.
	if err := unix.Fchown(fd, uid, gid); err != nil {
		return fmt.Errorf("snapshot: member %q: %w", member, err)
	}
	if err := unix.Fchmod(fd, mode); err != nil {
		return fmt.Errorf("snapshot: member %q: %w", member, err)
	}
	ts := []unix.Timespec{{Nsec: unix.UTIME_OMIT}, unix.NsecToTimespec(mtime.UnixNano())}
	if err := unix.UtimesNanoAt(fd, "", ts, unix.AT_EMPTY_PATH); err != nil {
		return fmt.Errorf("snapshot: member %q: %w", member, err)
	}
	return nil
}

// pwriteFull writes all of b at off, taking short writes.
func pwriteFull(fd int, b []byte, off int64) error {
	for len(b) > 0 {
		n, err := unix.Pwrite(fd, b, off)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return err
		}
		if n == 0 {
			return unix.EIO
		}
		b, off = b[n:], off+int64(n)
	}
	return nil
}
