package executor

import (
	"unicode/utf8"
)

// tailBuffer keeps the last max bytes written to it and counts all of them.
// It grows on demand up to max (a task that prints nothing costs nothing)
// and then works as a ring: a write copies at most max bytes, never the
// whole tail, so the cost per byte is constant and memory is bounded by max
// whatever the stream's size. Not safe for concurrent use.
type tailBuffer struct {
	max   int
	buf   []byte // len(buf) < max: linear; len(buf) == max: ring
	start int    // ring mode: index of the oldest byte
	total int64
}

func newTailBuffer(max int) *tailBuffer { return &tailBuffer{max: max} }

// Write appends p, keeping only the last max bytes.
func (t *tailBuffer) Write(p []byte) {
	t.total += int64(len(p))
	if t.max <= 0 || len(p) == 0 {
		return
	}
	if len(p) >= t.max {
		t.grow(t.max)
		t.buf = t.buf[:t.max]
		copy(t.buf, p[len(p)-t.max:])
		t.start = 0
		return
	}
	if len(t.buf) < t.max {
		room := t.max - len(t.buf)
		n := min(room, len(p))
		t.grow(len(t.buf) + n)
		t.buf = append(t.buf, p[:n]...)
		p = p[n:]
		t.start = 0
		if len(p) == 0 {
			return
		}
	}
	// Ring mode, len(p) < max: overwrite the oldest bytes, wrapping once.
	n := copy(t.buf[t.start:], p)
	copy(t.buf, p[n:])
	t.start = (t.start + len(p)) % t.max
}

// grow makes cap(t.buf) at least n, doubling but never beyond max, so the
// buffer's memory stays bounded by max.
func (t *tailBuffer) grow(n int) {
	if cap(t.buf) >= n {
		return
	}
	c := max(n, min(2*cap(t.buf), t.max), 4096)
	c = min(c, t.max)
	nb := make([]byte, len(t.buf), c)
	copy(nb, t.buf)
	t.buf = nb
}

// bytes returns a copy of the kept bytes, oldest first.
func (t *tailBuffer) bytes() []byte {
	out := make([]byte, len(t.buf))
	n := copy(out, t.buf[t.start:])
	copy(out[n:], t.buf[:t.start])
	return out
}

// snapshot renders the kept bytes as a tail. When final is false (the
// stream is still being written) a trailing incomplete UTF-8 sequence is
// held back instead of being replaced, since its remaining bytes may still
// come. The final rendering is the one TailOf documents.
func (t *tailBuffer) snapshot(final bool) (tail string, truncated, sanitized bool) {
	data := t.bytes()
	truncated = t.total > int64(len(data))
	if !final {
		data = trimIncompleteSuffix(data)
	}
	return renderTail(data, truncated, t.max)
}

// TailOf returns the tail the executor reports for a finished stream whose
// bytes are b, with a tail size of n bytes ([Spec.TailBytes]; n <= 0 keeps
// nothing). It is the rule of [StreamResult]: the last n bytes, cut forward
// to the next UTF-8 boundary when the stream is longer than n, every byte
// that does not start a valid UTF-8 sequence replaced by U+FFFD
// (sanitized), and whole characters dropped from the front if the
// replacements made it longer than n bytes. truncated reports that tail is
// not the whole stream.
//
// The result depends only on the last n bytes of b and on whether b is
// longer than n, so a caller holding a long stream in a file may pass just
// its last n+1 bytes (or all of it when it is not longer than n).
func TailOf(b []byte, n int) (tail string, sanitized, truncated bool) {
	n = max(n, 0)
	data := b
	if len(data) > n {
		data = data[len(data)-n:]
	}
	tail, truncated, sanitized = renderTail(data, len(b) > n, n)
	return tail, sanitized, truncated
}

// renderTail turns the last bytes of a stream into a tail: when cut (the
// bytes do not start at the stream's start) it skips forward to the next
// UTF-8 boundary, it replaces every invalid byte with U+FFFD, and it keeps
// the result within limit bytes by dropping whole characters from the front
// (a replacement is 3 bytes for 1, so binary data grows). truncated reports
// whether the tail is not the whole stream.
func renderTail(data []byte, cut bool, limit int) (tail string, truncated, sanitized bool) {
	truncated = cut
	if cut {
		// A character is at most utf8.UTFMax bytes, so at most UTFMax-1
		// continuation bytes belong to a character cut by the ring; more
		// than that are invalid anyway and get replaced below.
		i := 0
		for i < len(data) && i < utf8.UTFMax-1 && !utf8.RuneStart(data[i]) {
			i++
		}
		data = data[i:]
	}
	if !utf8.Valid(data) {
		data = sanitizeUTF8(data)
		sanitized = true
	}
	if len(data) > limit {
		i := len(data) - limit
		for i < len(data) && !utf8.RuneStart(data[i]) {
			i++
		}
		data = data[i:]
		truncated = true
	}
	return string(data), truncated, sanitized
}

// sanitizeUTF8 returns data with each byte that does not start a valid
// UTF-8 sequence replaced by U+FFFD (the decoding rule of a Go range loop).
func sanitizeUTF8(data []byte) []byte {
	out := make([]byte, 0, len(data)+len(data)/2)
	for len(data) > 0 {
		r, size := utf8.DecodeRune(data)
		if r == utf8.RuneError && size == 1 {
			out = utf8.AppendRune(out, utf8.RuneError)
		} else {
			out = append(out, data[:size]...)
		}
		data = data[size:]
	}
	return out
}

// trimIncompleteSuffix drops a final UTF-8 sequence that is a valid but
// incomplete prefix of a character.
func trimIncompleteSuffix(data []byte) []byte {
	for i := len(data) - 1; i >= 0 && i >= len(data)-utf8.UTFMax; i-- {
		if utf8.RuneStart(data[i]) {
			if !utf8.FullRune(data[i:]) {
				return data[:i]
			}
			return data
		}
	}
	return data
}
