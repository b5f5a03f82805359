package executor

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"math/rand/v2"
	"os"
	"syscall"
	"testing"
)

// chunkReader serves data in chunks of random sizes, from one byte to
// several read buffers, the way a pipe returns what a task wrote, and
// calls onRead after each read (on the reader's goroutine).
type chunkReader struct {
	data   []byte
	rng    *rand.Rand
	reads  int
	onRead func(reads int)
}

func (c *chunkReader) Read(p []byte) (int, error) {
	if len(c.data) == 0 {
		return 0, io.EOF
	}
	var n int
	switch c.rng.IntN(4) {
	case 0:
		n = 1 + c.rng.IntN(64)
	case 1:
		n = 1 + c.rng.IntN(64<<10)
	default:
		n = len(p) // fills the buffer exactly
	}
	n = copy(p[:min(n, len(p))], c.data)
	c.data = c.data[n:]
	c.reads++
	if c.onRead != nil {
		c.onRead(c.reads)
	}
	return n, nil
}

// streamFrom runs a stream over data with the spill limit given and
// returns its result and error; onRead, if set, runs after each read.
func streamFrom(t *testing.T, data []byte, spillLimit int64, onRead func(s *stream, reads int)) (StreamResult, error) {
	t.Helper()
	s, err := newStream(&spillDir{path: t.TempDir(), exists: true}, "stdout", DefaultTailBytes, spillLimit)
	if err != nil {
		t.Fatal(err)
	}
	r := &chunkReader{data: data, rng: rand.New(rand.NewPCG(uint64(len(data)), 7))}
	if onRead != nil {
		r.onRead = func(reads int) { onRead(s, reads) }
	}
	s.readFrom(r)
	return s.finish()
}

func randomBytes(n int) []byte {
	b := make([]byte, n)
	_, _ = rand.NewChaCha8([32]byte{1, 2, 3}).Read(b)
	return b
}

func hexSHA(b []byte) string { s := sha256.Sum256(b); return hex.EncodeToString(s[:]) }

// The digest covers every byte in order, however the reads cut the
// stream: in the first small buffer only (no hash goroutine), across
// many large buffers, and with an exact multiple of the buffer size.
func TestStreamDigestCoversEveryByteInOrder(t *testing.T) {
	t.Parallel()
	for _, n := range []int{0, 1, smallReadBuf - 1, smallReadBuf, smallReadBuf + 1, smallReadBuf + 3*largeReadBuf, 9*largeReadBuf + 12345} {
		data := randomBytes(n)
		res, err := streamFrom(t, data, DefaultSpillLimitBytes, nil)
		if err != nil {
			t.Fatalf("%d bytes: %v", n, err)
		}
		if res.SHA256 != hexSHA(data) || res.TotalBytes != int64(n) {
			t.Errorf("%d bytes: sha %s total %d, want %s", n, res.SHA256, res.TotalBytes, hexSHA(data))
		}
		if n == 0 {
			continue // no spill file for an empty stream
		}
		spilled, err := os.ReadFile(res.SpillPath)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(spilled, data) || !res.SpillComplete {
			t.Errorf("%d bytes: spill file of %d bytes differs, complete %v", n, len(spilled), res.SpillComplete)
		}
	}
}

// Past the spill limit there is no file to hash from: the digest still
// covers the whole stream, the spill file holds its first bytes.
func TestStreamDigestPastSpillLimit(t *testing.T) {
	t.Parallel()
	const limit = 100_000
	data := randomBytes(7*largeReadBuf + 999)
	res, err := streamFrom(t, data, limit, nil)
	if err != nil {
		t.Fatal(err)
	}
	if res.SHA256 != hexSHA(data) || res.TotalBytes != int64(len(data)) {
		t.Errorf("sha %s total %d, want %s %d", res.SHA256, res.TotalBytes, hexSHA(data), len(data))
	}
	spilled, err := os.ReadFile(res.SpillPath)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(spilled, data[:limit]) || res.SpillBytes != limit || res.SpillComplete {
		t.Errorf("spill file of %d bytes (result %d), complete %v; want the first %d bytes", len(spilled), res.SpillBytes, res.SpillComplete, limit)
	}
}

// A spill file whose writes fail (a full disk: /dev/full returns ENOSPC
// to every write) stops at what was written; the digest still covers the
// whole stream and the result says the spill is incomplete.
func TestStreamDigestWhenSpillWriteFails(t *testing.T) {
	t.Parallel()
	data := randomBytes(5*largeReadBuf + 4321)
	var written int64
	res, err := streamFrom(t, data, DefaultSpillLimitBytes, func(s *stream, reads int) {
		if reads != 3 || s.spill == nil {
			return
		}
		// After two chunks went to the file, the disk is full.
		full, err := os.OpenFile("/dev/full", os.O_WRONLY, 0)
		if err != nil {
			t.Error(err)
			return
		}
		_ = s.spill.Close()
		s.spill, written = full, s.spillBytes
	})
	if !errors.Is(err, syscall.ENOSPC) {
		t.Errorf("error %v, want ENOSPC", err)
	}
	if res.SHA256 != hexSHA(data) || res.TotalBytes != int64(len(data)) {
		t.Errorf("sha %s total %d, want %s %d", res.SHA256, res.TotalBytes, hexSHA(data), len(data))
	}
	if written == 0 || res.SpillBytes != written || res.SpillComplete {
		t.Errorf("spill %d bytes (written before the disk filled %d), complete %v", res.SpillBytes, written, res.SpillComplete)
	}
	spilled, err := os.ReadFile(res.SpillPath)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(spilled, data[:written]) {
		t.Errorf("spill file of %d bytes is not the stream's first %d", len(spilled), written)
	}
}
