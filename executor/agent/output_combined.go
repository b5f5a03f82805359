package agent

import (
	"context"
	"errors"
	"os"
	"path/filepath"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	agentv1 "github.com/bashtask/bashtask-operator/api/agent/v1"
	"github.com/bashtask/bashtask-operator/executor"
	"github.com/bashtask/bashtask-operator/internal/outputorder"
)

// combinedSource is what ReadCombinedOutput frames: a task this
// incarnation ran (its executor handle: the journal and the streams as
// they grow), or a finished one an earlier incarnation ran (its files and
// the sizes of its status).
type combinedSource struct {
	live  *executor.Task
	dir   string
	fixed [3]executor.OutputState // index outputorder.Stdout, Stderr
}

// combinedState is one look at a combinedSource.
type combinedState struct {
	streams [3]executor.OutputState // index outputorder.Stdout, Stderr
	journal executor.OrderState
	ended   bool
}

// look returns the source's state and channels closed at the next change
// of either stream (nil for an ended one). With seal the run being read
// becomes a record first. Whether the streams ended is read before the
// journal, the journal before the spill sizes: a journal read after both
// streams ended can only have gained their last run, which the rest
// frames the same way, and every record's bytes are in the sizes.
func (c *combinedSource) look(seal bool) (combinedState, [2]<-chan struct{}) {
	if c.live == nil {
		j := executor.OrderState{Path: filepath.Join(c.dir, outputorder.Name), Stopped: true}
		if fi, err := os.Lstat(j.Path); err == nil && fi.Mode().IsRegular() {
			j.Bytes = fi.Size()
		}
		return combinedState{streams: c.fixed, journal: j, ended: true}, [2]<-chan struct{}{}
	}
	var st combinedState
	var ch [2]<-chan struct{}
	st.streams[outputorder.Stdout], ch[0] = c.live.Output(false)
	st.streams[outputorder.Stderr], ch[1] = c.live.Output(true)
	st.ended = st.streams[outputorder.Stdout].Ended && st.streams[outputorder.Stderr].Ended
	st.journal = c.live.Order(seal)
	for _, id := range []byte{outputorder.Stdout, outputorder.Stderr} {
		now, _ := c.live.Output(id == outputorder.Stderr)
		st.streams[id].SpillPath, st.streams[id].SpillBytes, st.streams[id].SpillFailed = now.SpillPath, now.SpillBytes, now.SpillFailed
	}
	return st, ch
}

// combinedSource finds the task. A task still starting is waited for;
// NOT_FOUND for an unknown UID.
func (s *Server) combinedSource(ctx context.Context, uid string) (*combinedSource, error) {
	dir := s.store.outputDir(uid)
	return awaitStart(ctx, s, uid, func(e *entry) (*combinedSource, error) {
		if e.task != nil {
			return &combinedSource{live: e.task, dir: dir}, nil
		}
		src := &combinedSource{dir: dir}
		for i, id := range []byte{outputorder.Stdout, outputorder.Stderr} {
			ss := e.stream(i)
			src.fixed[id] = executor.OutputState{
				SpillPath:       filepath.Join(dir, streamNames[i]),
				SpillBytes:      ss.GetSpill().GetBytes(),
				TotalBytes:      ss.GetTotalBytes(),
				SpillLimitBytes: e.rec.SpillLimitBytes,
				Ended:           true,
			}
		}
		return src, nil
	})
}

// ReadCombinedOutput implements the ReadCombinedOutput RPC (docs/agent.md,
// docs/output.md).
func (s *Server) ReadCombinedOutput(req *agentv1.ReadCombinedOutputRequest, srv agentv1.Executor_ReadCombinedOutputServer) error {
	ctx := srv.Context()
	uid, offset, limit := req.GetUid(), req.GetOffset(), req.GetLimitBytes()
	if err := checkReadRequest(uid, offset, limit); err != nil {
		return err
	}
	src, err := s.combinedSource(ctx, uid)
	if err != nil {
		return err
	}
	f := &framer{from: offset}
	defer f.close()
	st, changed := src.look(true)
	if err := f.update(st); err != nil {
		return err
	}
	if st.ended && offset > f.known {
		return status.Errorf(codes.OutOfRange, "stdout and stderr: offset %d is past the framed stream's end at %d bytes", offset, f.known)
	}
	if err := srv.Send(&agentv1.OutputChunk{Offset: offset, Header: f.state()}); err != nil {
		return err
	}
	w := &framedSender{srv: srv, f: f, next: offset, limit: limit}
	for {
		if err := f.walk(w); err != nil {
			if errors.Is(err, errLimit) {
				break
			}
			return errors.Join(w.flush(), err)
		}
		if err := w.flush(); err != nil {
			return err
		}
		if f.st.ended || !req.GetFollow() {
			break
		}
		select {
		case <-changed[0]:
		case <-changed[1]:
		case <-ctx.Done():
			return status.FromContextError(ctx.Err()).Err()
		}
		st, changed = src.look(true)
		if err := f.update(st); err != nil {
			return err
		}
	}
	if err := w.flush(); err != nil {
		return err
	}
	return srv.Send(&agentv1.OutputChunk{Offset: w.next, End: f.state()})
}

// framer turns a source's journal and spill files into the framed stream,
// from the framed offset from on: the records read so far wait in queue
// until walked; the streams' bytes no record holds are queued once both
// streams ended (outputorder.Rest).
type framer struct {
	from       int64
	st         combinedState
	journal    *os.File
	read       int64 // journal bytes parsed
	parser     outputorder.Parser
	queue      []outputorder.Record
	restQueued bool
	known      int64 // framed bytes of every record queued so far
	cursor     outputorder.Cursor
	files      [3]*os.File
}

// update takes a new look: the journal's new records, and the rest once
// the streams ended.
func (f *framer) update(st combinedState) error {
	f.st = st
	if n := st.journal.Bytes - f.read; n > 0 {
		if f.journal == nil {
			j, err := os.Open(st.journal.Path)
			if err != nil {
				return status.Errorf(codes.DataLoss, "stdout and stderr: opening the order journal: %v", err)
			}
			f.journal = j
		}
		buf := make([]byte, n)
		if _, err := f.journal.ReadAt(buf, f.read); err != nil {
			return status.Errorf(codes.DataLoss, "stdout and stderr: reading the order journal at %d: %v", f.read, err)
		}
		f.read += n
		if err := f.parser.Feed(buf, func(r outputorder.Record) error { f.push(r); return nil }); err != nil {
			return status.Errorf(codes.DataLoss, "stdout and stderr: %v", err)
		}
	}
	if st.ended && !f.restQueued {
		f.restQueued = true
		total := [3]int64{0, st.streams[outputorder.Stdout].TotalBytes, st.streams[outputorder.Stderr].TotalBytes}
		for _, r := range outputorder.Rest(f.parser.Sums, total) {
			f.push(r)
		}
	}
	return nil
}

func (f *framer) push(r outputorder.Record) {
	f.queue = append(f.queue, r)
	f.known += outputorder.FramedLen(r)
}

// walk sends the queued records' frames through w.
func (f *framer) walk(w *framedSender) error {
	for len(f.queue) > 0 {
		if err := f.cursor.Walk(f.queue[0], f.from, w.emit); err != nil {
			return err
		}
		f.queue = f.queue[1:]
	}
	return nil
}

func (f *framer) state() *agentv1.OutputState {
	return &agentv1.OutputState{TotalBytes: f.known, Complete: f.st.ended, SpillBytes: f.known}
}

func (f *framer) close() {
	for _, c := range append(f.files[:], f.journal) {
		if c != nil {
			_ = c.Close()
		}
	}
}

// errLimit stops a walk at the request's limit_bytes.
var errLimit = errors.New("limit_bytes reached")

// framedSender gathers the framed bytes into messages of up to
// OutputChunkBytes: a frame's header does not cost a message of its own.
type framedSender struct {
	srv   agentv1.Executor_ReadCombinedOutputServer
	f     *framer
	buf   []byte
	next  int64 // framed offset after the last byte gathered
	limit int64
	sent  int64 // bytes gathered, for limit
}

// room is how many bytes may be gathered before the buffer must go.
func (w *framedSender) room() int64 {
	if w.buf == nil {
		w.buf = make([]byte, 0, OutputChunkBytes)
	}
	n := int64(cap(w.buf) - len(w.buf))
	if w.limit > 0 {
		n = min(n, w.limit-w.sent)
	}
	return n
}

func (w *framedSender) flush() error {
	if len(w.buf) == 0 {
		return nil
	}
	err := w.srv.Send(&agentv1.OutputChunk{Offset: w.next - int64(len(w.buf)), Data: w.buf})
	w.buf = w.buf[:0]
	return err
}

// emit gathers one piece of the framed stream.
func (w *framedSender) emit(p outputorder.Piece) error {
	if len(p.Header) > 0 {
		return w.gather(int64(len(p.Header)), func(b []byte) (int, error) { return copy(b, p.Header), nil })
	}
	off := p.Offset
	return w.gather(p.Len, func(b []byte) (int, error) {
		n, err := w.f.readStream(p.Stream, off, b, w.next)
		off += int64(n)
		return n, err
	})
}

// gather appends n bytes that fill writes, a buffer at a time.
func (w *framedSender) gather(n int64, fill func([]byte) (int, error)) error {
	for n > 0 {
		room := w.room()
		if w.limit > 0 && w.sent >= w.limit {
			return errLimit
		}
		if room == 0 {
			if err := w.flush(); err != nil {
				return err
			}
			continue
		}
		k := min(room, n)
		got, err := fill(w.buf[len(w.buf) : len(w.buf)+int(k)])
		w.buf = w.buf[:len(w.buf)+got]
		w.next += int64(got)
		w.sent += int64(got)
		n -= int64(got)
		if err != nil {
			return err
		}
	}
	return nil
}

// readStream reads len(b) bytes of stream id from off into b; at is the
// framed offset of b's first byte, for errors. Bytes the spill file does
// not hold (past spillLimitBytes, or after a write error) are DATA_LOSS,
// after the bytes before them.
func (f *framer) readStream(id byte, off int64, b []byte, at int64) (int, error) {
	st := f.st.streams[id]
	name := streamNames[id-1]
	if off+int64(len(b)) > st.SpillBytes {
		if off >= st.SpillBytes {
			err := checkOutputRange(name, executor.OutputState{SpillBytes: st.SpillBytes, TotalBytes: max(st.TotalBytes, off+1), SpillLimitBytes: st.SpillLimitBytes, SpillFailed: st.SpillFailed}, off)
			return 0, status.Errorf(codes.DataLoss, "stdout and stderr from offset %d: %s", at, status.Convert(err).Message())
		}
		b = b[:st.SpillBytes-off]
	}
	if f.files[id] == nil {
		fh, err := os.Open(st.SpillPath)
		if err != nil {
			return 0, status.Errorf(codes.DataLoss, "stdout and stderr from offset %d: opening the %s spill file: %v", at, name, err)
		}
		f.files[id] = fh
	}
	n, err := f.files[id].ReadAt(b, off)
	if err != nil {
		return n, status.Errorf(codes.DataLoss, "stdout and stderr from offset %d: reading the %s spill file at %d: %v", at+int64(n), name, off+int64(n), err)
	}
	return n, nil
}
