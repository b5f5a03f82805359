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
)

// Read buffer sizes. A task that prints little reads through a small
// buffer; one that fills it switches to a large pooled buffer, so bulk
// output costs few system calls without every short task paying for a
// megabyte of zeroed memory.
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
	path := filepath.Join(dir.path, name)
	if err := checkSpillName(path); err != nil {
		return nil, err
	}
	return &stream{
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

// record appends a chunk to the spill file (up to the limit) and the tail.
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

// hashDepth is how many read buffers may wait for the hash at once. SHA-256
// runs at about the pipe's speed on one core, so on its own goroutine it
// takes the other core instead of every second of the copy; the depth
// bounds the memory this costs (hashDepth large buffers per busy stream).
const hashDepth = 4

// readFrom copies r into the stream until EOF or until r is closed or its
// read deadline passes (the executor's guard against a descendant that keeps
// the pipe open). Every chunk goes to the spill file and the tail here and
// to the hash on a second goroutine, in order; readFrom returns once the
// hash has taken every byte, so finish sees the whole stream's sum.
func (s *stream) readFrom(r io.Reader) {
	full := make(chan []byte, hashDepth)
	free := make(chan []byte, hashDepth+1)
	hashed := make(chan struct{})
	go func() {
		defer close(hashed)
		for b := range full {
			s.hash.Write(b)
			free <- b[:cap(b)]
		}
	}()
	var large []*[]byte // taken from largeBufPool, returned at the end
	defer func() {
		close(full)
		<-hashed
		s.end()
		for _, b := range large {
			largeBufPool.Put(b)
		}
	}()
	size := smallReadBuf
	allocated := 0
	next := func() []byte {
		for {
			select {
			case b := <-free:
				if cap(b) >= size {
					return b
				}
				allocated-- // a small buffer outgrown by the stream: dropped
				continue
			default:
			}
			if allocated < hashDepth {
				allocated++
				if size == smallReadBuf {
					return make([]byte, smallReadBuf)
				}
				b := largeBufPool.Get().(*[]byte)
				large = append(large, b)
				return *b
			}
			b := <-free
			if cap(b) >= size {
				return b
			}
			allocated--
		}
	}
	for {
		buf := next()
		n, err := r.Read(buf)
		if n > 0 {
			s.record(buf[:n])
			if n == len(buf) {
				size = largeReadBuf // a busy stream: read in large chunks
			}
			full <- buf[:n]
		} else {
			free <- buf
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
