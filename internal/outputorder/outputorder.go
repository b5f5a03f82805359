// Package outputorder is the order in which a task's stdout and stderr
// were read (docs/output.md, "stdout and stderr in one stream"): the order
// journal the executor writes beside the spill files, and the framed
// stream that serves both streams in that order. The agent frames a
// task's spill files and the output API frames the uploaded copies; both
// must agree on every byte, so both use this package.
//
// The journal is a version byte followed by one record per run of one
// stream: the unsigned varint (length<<1 | stream-1), length in bytes, 1
// or more. The framed stream is, for every record in order, the record's
// bytes cut into frames of at most MaxFramePayload bytes, each behind the
// 8-byte header of Docker's multiplexed attach stream: the stream (1
// stdout, 2 stderr), three zero bytes and the payload's length as a
// big-endian uint32. After the journal's records come the streams' bytes
// no record holds, stdout's first, then stderr's (Rest).
package outputorder

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// Stream numbers, as in a frame's first byte.
const (
	// Stdout is the command's standard output.
	Stdout byte = 1
	// Stderr is the command's standard error.
	Stderr byte = 2
)

const (
	// HeaderBytes is the size of a frame's header.
	HeaderBytes = 8
	// MaxFramePayload is the most bytes one frame carries, 1 MiB: a
	// reader's buffer for one frame stays small, and a run of one stream
	// costs 8 bytes a MiB.
	MaxFramePayload = 1 << 20
	// MaxRecords is the most records a journal holds, 1 048 576 (at most
	// 10 bytes each, usually 2 to 4). A task that switches between its
	// streams more often than that has the rest of its output framed by
	// the rule for bytes without a record: stdout's, then stderr's.
	MaxRecords = 1 << 20
	// Version is the journal's first byte.
	Version byte = 1
	// Name is the journal's file name beside the spill files "stdout" and
	// "stderr", and its object name beside theirs in the bucket.
	Name = "order"
)

// Record is one run of a stream: Len bytes of Stream, read one after the
// other with no byte of the other stream between them.
type Record struct {
	// Stream is Stdout or Stderr.
	Stream byte
	// Len is the run's length in bytes, 1 or more.
	Len int64
}

// AppendRecord appends r's encoding to dst; first adds the version byte
// that starts a journal.
func AppendRecord(dst []byte, r Record, first bool) []byte {
	if first {
		dst = append(dst, Version)
	}
	return binary.AppendUvarint(dst, uint64(r.Len)<<1|uint64(r.Stream-1))
}

// ErrJournal is wrapped by every error of a journal that cannot be read.
var ErrJournal = errors.New("invalid order journal")

// Parser decodes a journal handed to it in pieces, in order.
type Parser struct {
	pending []byte
	started bool
	// Records counts the records decoded so far.
	Records int
	// Sums holds, per stream (index Stdout, Stderr), the bytes of the
	// records decoded so far.
	Sums [3]int64
}

// Feed decodes b, the journal's next bytes, and calls f with each complete
// record. A record cut at the end of b is completed by the next Feed; at
// the end of a journal it was never written whole and counts for nothing.
// f's error stops the decoding and is returned.
func (p *Parser) Feed(b []byte, f func(Record) error) error {
	if len(p.pending) > 0 {
		b = append(p.pending, b...)
		p.pending = nil
	}
	if !p.started && len(b) > 0 {
		if b[0] != Version {
			return fmt.Errorf("%w: version %d, want %d", ErrJournal, b[0], Version)
		}
		p.started, b = true, b[1:]
	}
	for len(b) > 0 {
		v, n := binary.Uvarint(b)
		if n == 0 {
			p.pending = append([]byte(nil), b...)
			return nil
		}
		if n < 0 || v>>1 == 0 || v>>1 > 1<<62 {
			return fmt.Errorf("%w: bad record %d", ErrJournal, p.Records)
		}
		b = b[n:]
		r := Record{Stream: byte(v&1) + 1, Len: int64(v >> 1)}
		p.Records++
		p.Sums[r.Stream] += r.Len
		if err := f(r); err != nil {
			return err
		}
	}
	return nil
}

// Parse decodes a whole journal.
func Parse(journal []byte) ([]Record, error) {
	var p Parser
	var out []Record
	err := p.Feed(journal, func(r Record) error { out = append(out, r); return nil })
	return out, err
}

// Rest returns the records of the bytes no record of the journal holds:
// recorded is the bytes of each stream the journal's records hold
// (Parser.Sums), total each stream's length. Stdout's rest comes first.
func Rest(recorded, total [3]int64) []Record {
	var out []Record
	for _, s := range []byte{Stdout, Stderr} {
		if n := total[s] - recorded[s]; n > 0 {
			out = append(out, Record{Stream: s, Len: n})
		}
	}
	return out
}

// Header returns the header of a frame of n bytes of stream.
func Header(stream byte, n int64) [HeaderBytes]byte {
	var h [HeaderBytes]byte
	h[0] = stream
	binary.BigEndian.PutUint32(h[4:], uint32(n))
	return h
}

// FramedLen is the length of r's frames, headers included.
func FramedLen(r Record) int64 {
	frames := (r.Len + MaxFramePayload - 1) / MaxFramePayload
	return r.Len + frames*HeaderBytes
}

// Piece is one stretch of the framed stream: header bytes, or a range of
// one stream's bytes.
type Piece struct {
	// Header, when not empty, is these bytes of a frame's header.
	Header []byte
	// Stream, Offset and Len, when Header is empty, are Len bytes of
	// Stream from Offset.
	Stream      byte
	Offset, Len int64
}

// Cursor walks the framed stream record by record.
type Cursor struct {
	// Framed is the framed stream's bytes passed.
	Framed int64
	// Offsets is, per stream (index Stdout, Stderr), the stream's bytes
	// passed.
	Offsets [3]int64
}

// Walk passes record r's frames and calls emit with the pieces of them
// at or after the framed offset from, in order. emit's error stops the
// walk and is returned; the cursor is then not to be used further.
func (c *Cursor) Walk(r Record, from int64, emit func(Piece) error) error {
	for left := r.Len; left > 0; {
		n := min(left, MaxFramePayload)
		if c.Framed+HeaderBytes > from {
			h := Header(r.Stream, n)
			if err := emit(Piece{Header: h[max(0, from-c.Framed):]}); err != nil {
				return err
			}
		}
		c.Framed += HeaderBytes
		if c.Framed+n > from {
			skip := max(0, from-c.Framed)
			if err := emit(Piece{Stream: r.Stream, Offset: c.Offsets[r.Stream] + skip, Len: n - skip}); err != nil {
				return err
			}
		}
		c.Framed += n
		c.Offsets[r.Stream] += n
		left -= n
	}
	return nil
}
