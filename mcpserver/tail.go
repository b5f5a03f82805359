package mcpserver

import (
	"encoding/base64"
	"sync"
	"unicode/utf8"
)

// tailBuffer keeps the last max bytes written to it and counts them all.
type tailBuffer struct {
	mu    sync.Mutex
	max   int
	buf   []byte
	total int64
}

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.total += int64(len(p))
	t.buf = append(t.buf, p...)
	if over := len(t.buf) - t.max; over > 0 {
		t.buf = append(t.buf[:0], t.buf[over:]...)
	}
	return len(p), nil
}

// snapshot returns the tail, the offset its first byte has in the stream
// and the stream's total bytes.
func (t *tailBuffer) snapshot() (tail []byte, offset, total int64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return append([]byte(nil), t.buf...), t.total - int64(len(t.buf)), t.total
}

// Encodings of bytes in a tool result.
const (
	encodingText   = "text"
	encodingBase64 = "base64"
)

// encode returns b as UTF-8 text when it is valid UTF-8, else base64, and
// which.
func encode(b []byte) (data, encoding string) {
	if utf8.Valid(b) {
		return string(b), encodingText
	}
	return base64.StdEncoding.EncodeToString(b), encodingBase64
}

// clamp is v, or def when v is 0, bounded to [1, maximum].
func clamp(v, def, maximum int) int {
	switch {
	case v <= 0:
		return def
	case v > maximum:
		return maximum
	}
	return v
}
