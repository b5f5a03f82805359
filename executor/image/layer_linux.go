//go:build linux

package image

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/klauspost/compress/gzip"

	"github.com/klauspost/compress/zstd"
	"golang.org/x/sys/unix"
)

// fetchLayer downloads a layer the store lacks, unpacks it into a
// directory of tmp/, checks its diffID, syncs the file system, renames
// it into layers/ and makes its short link, pinned for the caller. It
// returns what it unpacked, or nil (not pinned) when the layer is
// present already. Nothing of a failed fetch stays (tmp/ goes on the
// next Open at the latest).
func (s *Store) fetchLayer(ctx context.Context, l layerInfo, prog *progress) (*unpackStats, error) {
	if s.has(l.diffID) {
		// Fetched by a flight that ended just before this one began.
		return nil, nil
	}
	tmp, err := os.MkdirTemp(filepath.Join(s.root, dirTmp), "layer-")
	if err != nil {
		return nil, fmt.Errorf("image store: %w", err)
	}
	defer os.RemoveAll(tmp)
	dir := filepath.Join(tmp, "l")
	if err := os.Mkdir(dir, 0o755); err != nil {
		return nil, fmt.Errorf("image store: %w", err)
	}
	st, err := s.download(ctx, l, dir, prog)
	if err != nil {
		return nil, err
	}
	return st, s.install(l.diffID, dir, st.bytes)
}

// download streams the layer's blob through decompression and the
// diffID's hash into unpack.
func (s *Store) download(ctx context.Context, l layerInfo, dir string, prog *progress) (*unpackStats, error) {
	rc, err := l.layer.Compressed()
	if err != nil {
		return nil, registryError("fetching layer "+l.digest, err)
	}
	defer rc.Close()
	cr := &countReader{r: rc, prog: prog, m: s}
	br := bufio.NewReaderSize(cr, 1<<20)
	dr, closeDR, err := decompress(br)
	if err != nil {
		return nil, fmt.Errorf("layer %s: %w", l.digest, err)
	}
	defer closeDR()
	h := sha256.New()
	tee := io.TeeReader(dr, h)
	st, err := unpack(ctx, tee, dir, unpackOptions{layer: l.digest, limit: s.opts.BudgetBytes})
	if err != nil {
		if cr.err != nil {
			return nil, registryError("fetching layer "+l.digest, cr.err)
		}
		return nil, err
	}
	// What follows the tar's end still counts for the digests.
	if _, err := io.Copy(io.Discard, tee); err != nil {
		return nil, registryError("fetching layer "+l.digest, err)
	}
	if _, err := io.Copy(io.Discard, br); err != nil {
		return nil, registryError("fetching layer "+l.digest, err)
	}
	if got := "sha256:" + hex.EncodeToString(h.Sum(nil)); got != l.diffID {
		return nil, fmt.Errorf("%w: layer %s unpacks to %s, its diffID is %s", ErrInvalid, l.digest, got, l.diffID)
	}
	return st, nil
}

// install makes an unpacked layer durable and visible.
func (s *Store) install(id, dir string, size int64) error {
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("image store: %w", err)
	}
	// One syncfs for the whole tree rather than an fsync per file.
	err = unix.Syncfs(fd)
	unix.Close(fd)
	if err != nil {
		return fmt.Errorf("image store: syncing layer %s: %w", id, err)
	}
	if err := os.Rename(dir, s.layerDir(id)); err != nil {
		return fmt.Errorf("image store: %w", err)
	}
	if err := syncDir(filepath.Join(s.root, dirLayers)); err != nil {
		return fmt.Errorf("image store: %w", err)
	}
	if err := s.makeLink(id); err != nil {
		return err
	}
	s.mu.Lock()
	s.layers[id] = &layerEntry{size: size, pins: 1}
	s.bytes += size
	s.updateGaugesLocked()
	s.mu.Unlock()
	return nil
}

func (s *Store) has(id string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.layers[id] != nil
}

// countReader counts the compressed bytes for the progress and the
// metric, and keeps the blob's error (a digest mismatch, the network).
type countReader struct {
	r    io.Reader
	prog *progress
	m    *Store
	err  error
}

func (c *countReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	if n > 0 {
		c.prog.add(int64(n))
		c.m.m.downloaded.Add(float64(n))
	}
	if err != nil && err != io.EOF {
		c.err = err
	}
	return n, err
}

// decompress recognises gzip and zstd by their magic numbers; anything
// else is read as an uncompressed tar.
func decompress(br *bufio.Reader) (io.Reader, func(), error) {
	magic, _ := br.Peek(4)
	switch {
	case bytes.HasPrefix(magic, []byte{0x1f, 0x8b}):
		zr, err := gzip.NewReader(br)
		if err != nil {
			return nil, nil, err
		}
		return zr, func() { zr.Close() }, nil
	case bytes.Equal(magic, []byte{0x28, 0xb5, 0x2f, 0xfd}):
		zr, err := zstd.NewReader(br)
		if err != nil {
			return nil, nil, err
		}
		return zr, zr.Close, nil
	}
	return br, func() {}, nil
}
