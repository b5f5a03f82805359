package executor

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"github.com/bashtask/bashtask-operator/internal/outputorder"
)

// Read buffer sizes. A task that prints little reads through a small
// buffer; one that fills it switches to large pooled buffers, so bulk
// output costs few hand-overs to the hash without every short task paying
// for a megabyte of zeroed memory.
const (
	smallReadBuf = 32 << 10
	largeReadBuf = 1 << 20
)

var largeBufPool = sync.Pool{New: func() any { b := make([]byte, largeReadBuf); return &b }}

// stream captures one output stream: every byte is hashed and counted, the
// first limit bytes go to the spill file, the last tail bytes stay in
// memory. Only the reader goroutine touches the hash and the spill file;
// mu guards the tail, which snapshots read concurrently.
//
// The spill file is created with the stream's first byte: most commands
// leave at least one stream empty, and a file created and removed for
// nothing is two metadata updates on the node's disk per stream and task.
// Start checked that the name is free (checkSpillName), so creating it
// fails only when something raced to plant a file there; the stream then
// goes on without a spill file and reports it incomplete.
type stream struct {
	id         byte          // outputorder.Stdout or outputorder.Stderr
	order      *orderJournal // shared by the task's two streams
	dir        *spillDir
	path       string
	spill      *os.File // nil until the first byte
	spillLimit int64
	spillBytes int64
	spillErr   error
	hash       hash.Hash

	mu   sync.Mutex
	tail *tailBuffer
	// Published for readers of the spill file (Task.Output), under mu:
	// the spill file's size once the bytes are written, whether writing
	// it failed, whether the stream has ended, and the channel closed at
	// the next change (nil while nobody waits, so a stream nobody follows
	// allocates nothing per chunk).
	pubSpill  int64
	pubFailed bool
	ended     bool
	changed   chan struct{}
}

// newStream prepares the stream whose spill file is name in dir, after
// checking that nothing exists under that name yet.
func newStream(dir *spillDir, name string, tailBytes int, spillLimit int64) (*stream, error) {
	return newOrderedStream(dir, name, tailBytes, spillLimit, nil)
}

// newOrderedStream is newStream for a stream whose chunks order records
// (stdout or stderr, after name).
func newOrderedStream(dir *spillDir, name string, tailBytes int, spillLimit int64, order *orderJournal) (*stream, error) {
	path := filepath.Join(dir.path, name)
	if err := checkSpillName(path); err != nil {
		return nil, err
	}
	id := outputorder.Stdout
	if name == "stderr" {
		id = outputorder.Stderr
	}
	return &stream{
		id:         id,
		order:      order,
		dir:        dir,
		path:       path,
		spillLimit: spillLimit,
		hash:       sha256.New(),
		tail:       newTailBuffer(tailBytes),
	}, nil
}

// checkSpillName refuses a spill file name that already exists, as a file,
// a directory or a symlink (dangling or not): output must never go into
// something planted in advance. A missing directory has no such name.
func checkSpillName(path string) error {
	_, err := os.Lstat(path)
	switch {
	case err == nil:
		return startErr(ErrSpillDir, path, os.ErrExist)
	case !errors.Is(err, os.ErrNotExist) && !errors.Is(err, syscall.ENOTDIR):
		return startErr(ErrSpillDir, path, err)
	}
	return nil
}

// create makes the spill file, exclusively and with mode 0600: O_EXCL
// refuses a file (or symlink) planted since Start, O_NOFOLLOW refuses to
// follow a symlink.
func (s *stream) create() error {
	if err := s.dir.ensure(); err != nil {
		return err
	}
	f, err := os.OpenFile(s.path, os.O_WRONLY|os.O_CREATE|os.O_EXCL|syscall.O_NOFOLLOW, 0o600)
	if err != nil {
		return err
	}
	s.spill = f
	return nil
}

// record appends a chunk to the spill file (up to the limit) and the tail,
// publishes the spill file's new size, adds the chunk to the order journal
// and then wakes the followers: a follower woken finds the chunk in the
// journal, and a journal record's bytes are in the spill file.
func (s *stream) record(p []byte) {
	if s.spill == nil && s.spillErr == nil && len(p) > 0 {
		s.spillErr = s.create()
	}
	if s.spillErr == nil && s.spillBytes < s.spillLimit {
		n := int(min(int64(len(p)), s.spillLimit-s.spillBytes))
		w, err := s.spill.Write(p[:n])
		s.spillBytes += int64(w)
		if err != nil {
			// A full disk must not stop the task or the hash; the spill is
			// reported incomplete instead.
			s.spillErr = err
		}
	}
	s.mu.Lock()
	s.tail.Write(p)
	s.pubSpill, s.pubFailed = s.spillBytes, s.spillErr != nil
	if s.order != nil {
		s.order.add(s.id, len(p))
	}
	s.wakeLocked()
	s.mu.Unlock()
}

// wakeLocked wakes the readers waiting for a change.
func (s *stream) wakeLocked() {
	if s.changed != nil {
		close(s.changed)
		s.changed = nil
	}
}

// end marks the stream ended (readFrom returned): no byte follows.
func (s *stream) end() {
	s.mu.Lock()
	s.ended = true
	s.wakeLocked()
	s.mu.Unlock()
}

// output returns the stream's state for readers of its spill file and a
// channel closed at its next change.
func (s *stream) output() (OutputState, <-chan struct{}) {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := OutputState{
		SpillPath:       s.path,
		SpillBytes:      s.pubSpill,
		TotalBytes:      s.tail.total,
		SpillLimitBytes: s.spillLimit,
		SpillFailed:     s.pubFailed,
		Ended:           s.ended,
	}
	if s.ended {
		return st, nil
	}
	if s.changed == nil {
		s.changed = make(chan struct{})
	}
	return st, s.changed
}

// hashDepth is how many large buffers a busy stream holds: the one being
// filled and up to hashDepth-1 waiting for the hash or being hashed.
// SHA-256 runs at about the pipe's speed on one core, so on its own
// goroutine it takes the other core instead of every second of the copy;
// the depth bounds the memory this costs, hashDepth*largeReadBuf bytes
// (4 MiB) per busy stream.
const hashDepth = 4

// hashQueue feeds the stream's hash on a second goroutine, in order: the
// reader fills a buffer through as many reads as it takes and hands it
// over only once it is full (or the stream ended), so the hash gets 1 MiB
// at a time however small the task's writes are. A task writing 8 KiB at
// a time is read in chunks of about 24 KiB (the reader keeps up with it),
// and handing each chunk over woke the hash's goroutine, parked and woken
// again, some 80 000 times for 2 GB. The hash is needed only at the end,
// so nothing waits for a buffer that fills slowly.
type hashQueue struct {
	h         hash.Hash
	full      chan []byte // buffers to hash, in order
	free      chan []byte // hashed buffers, for the reader to fill again
	hashed    chan struct{}
	allocated int       // large buffers taken from largeBufPool
	large     []*[]byte // the same, returned at close
}

// push hands b, full, to the hash. The goroutine starts with the first
// buffer: a stream that never fills its first buffer hashes it in close,
// on the reader's goroutine, and costs no goroutine at all.
func (q *hashQueue) push(b []byte) {
	if q.full == nil {
		q.full = make(chan []byte, hashDepth-1)
		q.free = make(chan []byte, hashDepth+1) // every buffer, the small one too: the hash never waits to give one back
		q.hashed = make(chan struct{})
		go func() {
			defer close(q.hashed)
			for b := range q.full {
				q.h.Write(b)
				q.free <- b[:cap(b)]
			}
		}()
	}
	q.full <- b
}

// next returns an empty large buffer: a hashed one, a new one while fewer
// than hashDepth exist, else the next one the hash gives back. The first,
// small buffer is dropped when the hash gives it back.
func (q *hashQueue) next() []byte {
	for {
		var b []byte
		select {
		case b = <-q.free:
		default:
			if q.allocated < hashDepth {
				q.allocated++
				p := largeBufPool.Get().(*[]byte)
				q.large = append(q.large, p)
				return *p
			}
			b = <-q.free
		}
		if cap(b) >= largeReadBuf {
			return b
		}
	}
}

// close hashes rest, the partly filled last buffer, after everything
// pushed before, waits for the hash to take every byte and returns the
// large buffers to the pool.
func (q *hashQueue) close(rest []byte) {
	if q.full != nil {
		if len(rest) > 0 {
			q.full <- rest
		}
		close(q.full)
		<-q.hashed
	} else {
		q.h.Write(rest)
	}
	for _, b := range q.large {
		largeBufPool.Put(b)
	}
}

// A busy stream's reader (one past its first, small buffer) that reads
// less than coalesceBytes, because it caught up with the task, waits
// coalesceDelay before reading again. A pipe wakes its reader at each
// write into an empty pipe: a task writing 8 KiB at a time (coreutils'
// buffer) woke the reader about 40 000 times a GB, and the wake-ups (the
// poller, the runtime's scheduler, the task's own switches) cost the
// executor as much CPU as the copy. Waiting 200 µs lets about 300 KB
// gather at 1.7 GB/s (the pipe holds pipeSize, 1 MiB, so the task
// does not stop), and the reader wakes about 6 000 times a GB. It delays
// a busy stream's bytes, and its end, by at most coalesceDelay; a stream
// that stayed within its first buffer (most tasks) never waits.
const (
	coalesceBytes = 64 << 10
	coalesceDelay = 200 * time.Microsecond
)

// readFrom copies r into the stream until EOF or until r is closed or its
// read deadline passes (the executor's guard against a descendant that keeps
// the pipe open). Every chunk read goes to the spill file and the tail at
// once, and to the hash through hashQueue, in order, a buffer at a time;
// readFrom returns once the hash has taken every byte, so finish sees the
// whole stream's sum.
func (s *stream) readFrom(r io.Reader) {
	q := hashQueue{h: s.hash}
	buf := make([]byte, smallReadBuf) // most tasks print less than this
	filled := 0
	defer func() {
		q.close(buf[:filled])
		s.end()
	}()
	for {
		n, err := r.Read(buf[filled:])
		if n > 0 {
			s.record(buf[filled : filled+n])
			filled += n
			if filled == len(buf) {
				q.push(buf)
				buf, filled = q.next(), 0
			}
			if n < coalesceBytes && len(buf) == largeReadBuf && err == nil {
				// A busy stream's reader caught up with the task: let
				// its next writes gather in the pipe.
				pauseReader(coalesceDelay)
			}
		}
		if err != nil {
			return
		}
	}
}

// snapshot returns the stream's state so far.
func (s *stream) snapshot() StreamSnapshot {
	s.mu.Lock()
	defer s.mu.Unlock()
	tail, truncated, sanitized := s.tail.snapshot(false)
	return StreamSnapshot{Tail: tail, TotalBytes: s.tail.total, Truncated: truncated, Sanitized: sanitized}
}

// finish closes the spill file and returns the final description. It must
// be called after readFrom returned. An empty stream has no spill file.
func (s *stream) finish() (StreamResult, error) {
	var closeErr error
	if s.spill != nil {
		closeErr = s.spill.Close()
	}
	s.end() // also for a stream whose reader never ran
	s.mu.Lock()
	tail, truncated, sanitized := s.tail.snapshot(true)
	total := s.tail.total
	s.mu.Unlock()
	res := StreamResult{
		Tail:          tail,
		TotalBytes:    total,
		Truncated:     truncated,
		Sanitized:     sanitized,
		SHA256:        hex.EncodeToString(s.hash.Sum(nil)),
		SpillPath:     s.path,
		SpillBytes:    s.spillBytes,
		SpillComplete: s.spillErr == nil && closeErr == nil && s.spillBytes == total,
	}
	err := errors.Join(s.spillErr, closeErr)
	if err != nil {
		err = fmt.Errorf("writing spill file %s: %w", s.path, err)
	}
	return res, err
}

// tailCap is the capacity of the tail's memory in bytes (for tests of the
// memory bound).
func (s *stream) tailCap() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return cap(s.tail.buf)
}
