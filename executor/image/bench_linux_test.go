//go:build linux

package image

import (
	"archive/tar"
	"bytes"
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// benchLayer is a layer of about mib MiB of mixed files: many small text
// files, some medium binaries (half random, half repeated text) and one
// large file with holes.
func benchLayer(b *testing.B, seed uint64, mib int) v1.Layer {
	rng := rand.New(rand.NewPCG(seed, 1))
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	mtime := time.Unix(1700000000, 0)
	text := bytes.Repeat([]byte("the quick brown fox jumps over the lazy dog\n"), 1<<15)
	write := func(name string, data []byte) {
		if err := tw.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Size: int64(len(data)), ModTime: mtime, Typeflag: tar.TypeReg}); err != nil {
			b.Fatal(err)
		}
		if _, err := tw.Write(data); err != nil {
			b.Fatal(err)
		}
	}
	target := int64(mib) << 20
	for i := 0; int64(buf.Len()) < target; i++ {
		dir := fmt.Sprintf("usr/share/d%03d/", i)
		if err := tw.WriteHeader(&tar.Header{Name: dir, Mode: 0o755, ModTime: mtime, Typeflag: tar.TypeDir}); err != nil {
			b.Fatal(err)
		}
		for j := range 200 {
			n := 512 + rng.IntN(8<<10)
			write(dir+"f"+strconv.Itoa(j), text[:n])
		}
		med := make([]byte, 2<<20)
		for k := 0; k < len(med)/2; k += 8 {
			v := rng.Uint64()
			for x := range 8 {
				med[k+x] = byte(v >> (8 * x))
			}
		}
		copy(med[len(med)/2:], text)
		write(dir+"bin", med)
		if i%32 == 0 {
			big := make([]byte, 16<<20)
			copy(big[4<<20:], text[:1<<20])
			write(dir+"sparse", big)
		}
	}
	if err := tw.Close(); err != nil {
		b.Fatal(err)
	}
	data := buf.Bytes()
	l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(data)), nil })
	if err != nil {
		b.Fatal(err)
	}
	return l
}

// BenchmarkPull pulls and unpacks a generated image of four layers of
// mixed files (BENCH_IMAGE_MIB MiB of tar in all, 256 by default) from
// the in-process registry into an empty store, and reports MB/s of
// uncompressed tar.
func BenchmarkPull(b *testing.B) {
	needRoot(b)
	mib := 256
	if v, err := strconv.Atoi(os.Getenv("BENCH_IMAGE_MIB")); err == nil && v > 0 {
		mib = v
	}
	var layers []v1.Layer
	var tarBytes, gzBytes int64
	for i := range 4 {
		l := benchLayer(b, uint64(i), mib/4)
		layers = append(layers, l)
		u, _ := l.Uncompressed()
		n, _ := io.Copy(io.Discard, u)
		u.Close()
		c, _ := l.Size()
		tarBytes, gzBytes = tarBytes+n, gzBytes+c
	}
	reg := newTestRegistry(b, nil)
	push(b, reg.host, "bench:1", makeImage(b, arch, layers...))
	b.SetBytes(tarBytes)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		s, err := Open(filepath.Join(b.TempDir(), strconv.Itoa(i)), StoreOptions{})
		if err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		start := time.Now()
		im, err := s.Pull(context.Background(), reg.host+"/bench:1", PullOptions{})
		if err != nil {
			b.Fatal(err)
		}
		el := time.Since(start)
		b.Logf("pulled %d MB of tar (%d MB gzip, %d MB of file data) in %v: %.0f MB/s", tarBytes/1e6, gzBytes/1e6, im.Size/1e6, el.Round(time.Millisecond), float64(tarBytes)/1e6/el.Seconds())
		im.Release()
		b.StopTimer()
		s.Close()
		b.StartTimer()
	}
}
