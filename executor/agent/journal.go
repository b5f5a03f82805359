package agent

import (
	"cmp"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"path/filepath"
	"slices"
	"sync"

	"google.golang.org/protobuf/proto"

	agentv1 "github.com/bashtask/bashtask-operator/api/agent/v1"
)

// store is the on-disk side of the task table: one append-only journal of
// task records, <state-dir>/records.journal, and per task a directory,
// <state-dir>/tasks/<uid>, for its spill files, which the executor makes
// with the task's first byte of output.
//
// Every transition of a task (starting, running, progress, finished,
// uploaded, forgotten) appends one frame; the last frame of a UID is its
// record. A journal rather than a file per task: creating and replacing
// small files costs inode and directory updates on every transition of
// every task, which on a busy node's disk took more CPU than the rest of a
// short task's life in the agent; an append is one write(2) to the page
// cache. The journal is rewritten with only the live records (compacted)
// when it is opened and whenever it grows past compactMinBytes and four
// times the live records' size.
//
// Frames are not fsynced. They exist for the next incarnation of the agent
// on the same boot: a killed or restarted agent finds them in the page
// cache, which outlives the process. A node that crashes or loses power
// loses every task process with it, and the records' boot ID already makes
// recovery treat such tasks as gone; a record lost there makes the task one
// the new incarnation does not know, which the controller reports as
// AgentRestarted, as it would with the record. A write cut short by the
// agent's death is at the journal's end, fails its checksum, and is
// discarded when the journal is next opened.
//
// Frame layout, little-endian: body length (uint32), CRC-32C of the body
// (uint32), then the body: UID length (uint16), UID, kind (frameRecord or
// frameForgotten) and, for a record, its JSON (record, with the status in
// protobuf binary form).
type store struct {
	dir  string // <state-dir>/tasks, the output directories
	path string // the journal

	mu        sync.Mutex
	f         *os.File // the journal, opened for reading and appending
	size      int64
	live      map[string]frameRef // last frame of each UID not forgotten
	liveBytes int64
	// loaded is what open found, for recovery (records).
	loaded map[string]loadedRecord
	// damaged says why open cut off the journal's tail; nil when it did
	// not.
	damaged error
	// compactMin is compactMinBytes, smaller in tests.
	compactMin int64
}

// frameRef locates a frame in the journal.
type frameRef struct{ off, n int64 }

// loadedRecord is one UID's record as the journal held it at open, or why
// it could not be decoded.
type loadedRecord struct {
	rec    *record
	status *agentv1.TaskStatus
	err    error
}

// Frame kinds.
const (
	frameRecord    byte = 'R'
	frameForgotten byte = 'F'
)

const (
	// frameHeader is the length and checksum before each body.
	frameHeader = 8
	// maxFrameBody bounds a body: a record holds two tails of at most
	// executor.MaxTailBytes each, escaped, and small fields; 16 MiB is far
	// above it, and a length past it marks a damaged frame.
	maxFrameBody = 16 << 20
	// compactMinBytes is the journal size below which it is never
	// compacted while the agent runs.
	compactMinBytes = 8 << 20
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// openStore opens (or creates) the journal of stateDir, reads every frame,
// cuts off a damaged or unfinished tail, and compacts it. tasksDir holds the
// tasks' output directories.
func openStore(stateDir, tasksDir string) (*store, error) {
	st := &store{dir: tasksDir, path: filepath.Join(stateDir, "records.journal"),
		live: map[string]frameRef{}, loaded: map[string]loadedRecord{}, compactMin: compactMinBytes}
	f, err := os.OpenFile(st.path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("opening the record journal: %w", err)
	}
	good, damage, err := st.load(f)
	if err != nil {
		f.Close()
		return nil, err
	}
	if damage != nil {
		if err := f.Truncate(good); err != nil {
			f.Close()
			return nil, fmt.Errorf("cutting the damaged end of the record journal: %w", err)
		}
	}
	st.f, st.size, st.damaged = f, good, damage
	st.mu.Lock()
	defer st.mu.Unlock()
	if err := st.compactLocked(); err != nil {
		st.f.Close()
		return nil, err
	}
	return st, nil
}

// load reads frames from the start of f until its end or the first frame
// that is incomplete or fails its checksum. It returns the offset where the
// good frames end and, when bytes follow it, why they were discarded.
func (st *store) load(f *os.File) (good int64, damage error, err error) {
	fi, err := f.Stat()
	if err != nil {
		return 0, nil, fmt.Errorf("reading the record journal: %w", err)
	}
	r := io.NewSectionReader(f, 0, fi.Size())
	var hdr [frameHeader]byte
	for {
		if _, err := io.ReadFull(r, hdr[:]); err != nil {
			if errors.Is(err, io.EOF) {
				return good, nil, nil
			}
			return good, fmt.Errorf("an incomplete frame header at offset %d", good), nil
		}
		n := int64(binary.LittleEndian.Uint32(hdr[0:4]))
		if n > maxFrameBody || good+frameHeader+n > fi.Size() {
			return good, fmt.Errorf("a frame of %d bytes at offset %d runs past the end", n, good), nil
		}
		body := make([]byte, n)
		if _, err := io.ReadFull(r, body); err != nil {
			return good, fmt.Errorf("reading the frame at offset %d: %w", good, err), nil
		}
		if crc32.Checksum(body, castagnoli) != binary.LittleEndian.Uint32(hdr[4:8]) {
			return good, fmt.Errorf("the frame at offset %d fails its checksum", good), nil
		}
		uid, kind, payload, ok := parseBody(body)
		if !ok {
			return good, fmt.Errorf("the frame at offset %d is malformed", good), nil
		}
		ref := frameRef{off: good, n: frameHeader + n}
		good += ref.n
		switch kind {
		case frameForgotten:
			st.forgetLocked(uid)
		case frameRecord:
			st.setLocked(uid, ref)
			st.loaded[uid] = decodeRecord(uid, payload)
		}
	}
}

func parseBody(body []byte) (uid string, kind byte, payload []byte, ok bool) {
	if len(body) < 3 {
		return "", 0, nil, false
	}
	ul := int(binary.LittleEndian.Uint16(body[0:2]))
	if len(body) < 2+ul+1 {
		return "", 0, nil, false
	}
	uid, kind, payload = string(body[2:2+ul]), body[2+ul], body[3+ul:]
	if !validUID.MatchString(uid) || (kind != frameRecord && kind != frameForgotten) {
		return "", 0, nil, false
	}
	return uid, kind, payload, true
}

func decodeRecord(uid string, payload []byte) loadedRecord {
	rec := &record{}
	if err := json.Unmarshal(payload, rec); err != nil {
		return loadedRecord{err: fmt.Errorf("decoding record of task %s: %w", uid, err)}
	}
	if rec.Version != recordVersion {
		return loadedRecord{err: fmt.Errorf("record of task %s has version %d, want %d", uid, rec.Version, recordVersion)}
	}
	status := &agentv1.TaskStatus{}
	if err := proto.Unmarshal(rec.Status, status); err != nil {
		return loadedRecord{err: fmt.Errorf("decoding status of task %s: %w", uid, err)}
	}
	return loadedRecord{rec: rec, status: status}
}

// records returns, sorted by UID, the UIDs whose records open found, and
// hands their contents to recovery once: loaded is dropped.
func (st *store) records() ([]string, map[string]loadedRecord) {
	st.mu.Lock()
	defer st.mu.Unlock()
	loaded := st.loaded
	st.loaded = nil
	uids := make([]string, 0, len(loaded))
	for uid := range loaded {
		uids = append(uids, uid)
	}
	slices.Sort(uids)
	return uids, loaded
}

// read decodes uid's current record from the journal.
func (st *store) read(uid string) (*record, *agentv1.TaskStatus, error) {
	st.mu.Lock()
	ref, ok := st.live[uid]
	buf := make([]byte, ref.n)
	var err error
	if ok {
		_, err = st.f.ReadAt(buf, ref.off)
	}
	st.mu.Unlock()
	switch {
	case !ok:
		return nil, nil, fmt.Errorf("task %s has no record", uid)
	case err != nil:
		return nil, nil, fmt.Errorf("reading record of task %s: %w", uid, err)
	}
	_, _, payload, ok := parseBody(buf[frameHeader:])
	if !ok {
		return nil, nil, fmt.Errorf("record of task %s is malformed", uid)
	}
	lr := decodeRecord(uid, payload)
	return lr.rec, lr.status, lr.err
}

func (st *store) outputDir(uid string) string { return filepath.Join(st.dir, uid) }

// exists reports whether anything of uid is kept: a record (readable or
// not) or an output directory.
func (st *store) exists(uid string) bool {
	st.mu.Lock()
	_, ok := st.live[uid]
	st.mu.Unlock()
	if ok {
		return true
	}
	_, err := os.Lstat(st.outputDir(uid))
	return !errors.Is(err, os.ErrNotExist)
}

// write appends rec, with status, as uid's record.
func (st *store) write(uid string, rec *record, status *agentv1.TaskStatus) error {
	js, err := proto.Marshal(status)
	if err != nil {
		return fmt.Errorf("encoding status of task %s: %w", uid, err)
	}
	rec.Version = recordVersion
	rec.Status = js
	data, err := json.Marshal(rec)
	if err != nil {
		return fmt.Errorf("encoding record of task %s: %w", uid, err)
	}
	if err := st.append(uid, frameRecord, data); err != nil {
		return fmt.Errorf("writing record of task %s: %w", uid, err)
	}
	return nil
}

// remove deletes a task's output directory and then its record.
func (st *store) remove(uid string) error {
	if err := os.RemoveAll(st.outputDir(uid)); err != nil {
		return fmt.Errorf("removing output of task %s: %w", uid, err)
	}
	if err := st.append(uid, frameForgotten, nil); err != nil {
		return fmt.Errorf("removing record of task %s: %w", uid, err)
	}
	return nil
}

// append writes one frame with a single write(2) at the journal's end.
func (st *store) append(uid string, kind byte, payload []byte) error {
	n := 2 + len(uid) + 1 + len(payload)
	if n > maxFrameBody {
		return fmt.Errorf("a record of %d bytes is over the journal's limit of %d", n, maxFrameBody)
	}
	buf := make([]byte, frameHeader+n)
	body := buf[frameHeader:]
	binary.LittleEndian.PutUint16(body[0:2], uint16(len(uid)))
	copy(body[2:], uid)
	body[2+len(uid)] = kind
	copy(body[3+len(uid):], payload)
	binary.LittleEndian.PutUint32(buf[0:4], uint32(n))
	binary.LittleEndian.PutUint32(buf[4:8], crc32.Checksum(body, castagnoli))

	st.mu.Lock()
	defer st.mu.Unlock()
	if _, err := st.f.WriteAt(buf, st.size); err != nil {
		// A partial frame at the end is cut off by the next open; the
		// next append writes over it.
		return err
	}
	ref := frameRef{off: st.size, n: int64(len(buf))}
	st.size += ref.n
	if kind == frameForgotten {
		st.forgetLocked(uid)
	} else {
		st.setLocked(uid, ref)
	}
	if st.size > st.compactMin && st.size > 4*st.liveBytes {
		return st.compactLocked()
	}
	return nil
}

func (st *store) setLocked(uid string, ref frameRef) {
	st.liveBytes += ref.n - st.live[uid].n
	st.live[uid] = ref
}

func (st *store) forgetLocked(uid string) {
	st.liveBytes -= st.live[uid].n
	delete(st.live, uid)
	delete(st.loaded, uid)
}

// compactLocked rewrites the journal with the last frame of each live UID:
// a new file, renamed over the old one, so a crash leaves one or the other.
func (st *store) compactLocked() error {
	if st.size == st.liveBytes {
		return nil // nothing to drop
	}
	tmp := st.path + ".compact"
	out, err := os.OpenFile(tmp, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return fmt.Errorf("compacting the record journal: %w", err)
	}
	uids := make([]string, 0, len(st.live))
	for uid := range st.live {
		uids = append(uids, uid)
	}
	// In journal order, so the file reads as a history.
	slices.SortFunc(uids, func(a, b string) int { return cmp.Compare(st.live[a].off, st.live[b].off) })
	live := make(map[string]frameRef, len(uids))
	var off int64
	for _, uid := range uids {
		ref := st.live[uid]
		buf := make([]byte, ref.n)
		_, err := st.f.ReadAt(buf, ref.off)
		if err == nil {
			_, err = out.WriteAt(buf, off)
		}
		if err != nil {
			out.Close()
			os.Remove(tmp)
			return fmt.Errorf("compacting the record journal: %w", err)
		}
		live[uid] = frameRef{off: off, n: ref.n}
		off += ref.n
	}
	if err := os.Rename(tmp, st.path); err != nil {
		out.Close()
		os.Remove(tmp)
		return fmt.Errorf("compacting the record journal: %w", err)
	}
	st.f.Close()
	st.f, st.size, st.live, st.liveBytes = out, off, live, off
	return nil
}

// close closes the journal.
func (st *store) close() error {
	st.mu.Lock()
	defer st.mu.Unlock()
	return st.f.Close()
}
