package executor

import (
	"os"
	"path/filepath"
	"sync"
	"syscall"

	"github.com/bashtask/bashtask-operator/internal/outputorder"
)

// orderJournal records the order in which the task's two readers read
// their chunks (docs/output.md, "stdout and stderr in one stream"): each
// reader adds its chunk under mu once the chunk is in the spill file and
// before it wakes the followers, so the journal's order is the order of
// the reads. Chunks written by the command at the same instant may be
// read in either order.
//
// Consecutive chunks of one stream make one run; a run becomes a record
// in the file, the spill directory's "order", when the other stream is
// read, or when a follower asks for it (Task.Order with seal), since a
// record is never changed once a reader may have framed it. The last run
// is never written: the framed stream gives the bytes no record holds at
// the end (outputorder.Rest), which is that run. A task that prints to
// one stream only therefore writes no journal at all, and one that
// switches streams writes a few bytes per switch, never per chunk.
type orderJournal struct {
	dir  *spillDir
	path string

	mu      sync.Mutex
	f       *os.File // nil until the first record
	open    outputorder.Record
	bytes   int64 // of whole records in the file
	records int
	stopped bool // full (outputorder.MaxRecords) or writing failed: no record follows
	buf     []byte
}

// newOrderJournal prepares the journal in dir after checking that nothing
// exists under its name yet, as for the spill files.
func newOrderJournal(dir *spillDir) (*orderJournal, error) {
	path := filepath.Join(dir.path, outputorder.Name)
	if err := checkSpillName(path); err != nil {
		return nil, err
	}
	return &orderJournal{dir: dir, path: path}, nil
}

// add records n bytes read from stream.
func (o *orderJournal) add(stream byte, n int) {
	o.mu.Lock()
	if o.open.Len > 0 && o.open.Stream != stream {
		o.sealLocked()
	}
	o.open.Stream = stream
	o.open.Len += int64(n)
	o.mu.Unlock()
}

// sealLocked writes the open run as a record. Once the journal is full or
// a write failed it writes nothing more: the bytes after its last record
// are framed by outputorder.Rest, and a write cut short leaves a record
// that readers of the file ignore.
func (o *orderJournal) sealLocked() {
	r := o.open
	o.open = outputorder.Record{}
	if r.Len == 0 || o.stopped {
		return
	}
	if o.records >= outputorder.MaxRecords {
		o.stopped = true
		return
	}
	if o.f == nil {
		if err := o.create(); err != nil {
			o.stopped = true
			return
		}
	}
	o.buf = outputorder.AppendRecord(o.buf[:0], r, o.bytes == 0)
	n, err := o.f.Write(o.buf)
	if err != nil || n != len(o.buf) {
		o.stopped = true
		return
	}
	o.bytes += int64(n)
	o.records++
}

// create makes the journal's file as stream.create makes a spill file.
func (o *orderJournal) create() error {
	if err := o.dir.ensure(); err != nil {
		return err
	}
	f, err := os.OpenFile(o.path, os.O_WRONLY|os.O_CREATE|os.O_EXCL|syscall.O_NOFOLLOW, 0o600)
	if err != nil {
		return err
	}
	o.f = f
	return nil
}

// state returns the journal's state, after making the open run a record
// when seal is set.
func (o *orderJournal) state(seal bool) OrderState {
	o.mu.Lock()
	defer o.mu.Unlock()
	if seal && o.open.Len > 0 {
		o.sealLocked()
	}
	return OrderState{Path: o.path, Bytes: o.bytes, Records: o.records, Stopped: o.stopped}
}

// close closes the journal's file; the last run stays unwritten.
func (o *orderJournal) close() error {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.f == nil {
		return nil
	}
	err := o.f.Close()
	o.f = nil
	o.stopped = true
	return err
}

// OrderState is the order journal's state as a reader of its file sees it
// (Task.Order; docs/output.md).
type OrderState struct {
	// Path is the journal's file, the spill directory's "order"; it
	// exists once Bytes is above zero.
	Path string
	// Bytes is how many bytes of the file hold whole records, the version
	// byte included: a reader reads no further.
	Bytes int64
	// Records is how many records those bytes hold.
	Records int
	// Stopped is true when no record follows: the journal is full
	// (outputorder.MaxRecords), writing it failed, or the task ended.
	Stopped bool
}

// Order returns the order journal's state. With seal, the run being read
// becomes a record first, so a follower can frame its bytes at once. Get
// the streams' change channels (Output) before Order: a chunk read after
// Output closes them, one read before is in the journal.
func (t *Task) Order(seal bool) OrderState {
	return t.order.state(seal)
}
