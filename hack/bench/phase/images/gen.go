package images

import (
	"archive/tar"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// craneBinary returns path when set, else builds go-containerregistry's
// cmd/crane at the version go.mod requires into dir.
func craneBinary(ctx context.Context, path, dir string) (string, error) {
	if path != "" {
		return path, nil
	}
	out, err := exec.CommandContext(ctx, "go", "list", "-m", "-f", "{{.Version}}", "github.com/google/go-containerregistry").Output()
	if err != nil {
		return "", fmt.Errorf("go list -m github.com/google/go-containerregistry: %w", err)
	}
	pkg := "github.com/google/go-containerregistry/cmd/crane@" + strings.TrimSpace(string(out))
	fmt.Printf("building %s ...\n", pkg)
	cmd := exec.CommandContext(ctx, "go", "install", pkg)
	cmd.Env = append(os.Environ(), "GOBIN="+dir)
	cmd.Stderr = os.Stderr
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("go install %s: %w", pkg, err)
	}
	return filepath.Join(dir, "crane"), nil
}

// diskBytes is the disk space of the tree at dir: the blocks of every file
// and directory, a hard-linked file counted once.
func diskBytes(dir string) (int64, error) {
	seen := map[uint64]bool{}
	var n int64
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		var st syscall.Stat_t
		if err := syscall.Lstat(p, &st); err != nil {
			return err
		}
		if seen[st.Ino] {
			return nil
		}
		seen[st.Ino] = true
		n += st.Blocks * 512
		return nil
	})
	return n, err
}

// generatedImage writes four layers of mixed files, mib MiB of tar in all,
// gzip-compressed into dir, and returns the image of them.
func generatedImage(dir string, mib int) (v1.Image, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	var adds []mutate.Addendum
	for i := range 4 {
		p := filepath.Join(dir, fmt.Sprintf("layer%d.tar.gz", i))
		if err := writeMixedLayer(p, uint64(i), int64(mib)<<20/4); err != nil {
			return nil, err
		}
		l, err := tarball.LayerFromFile(p)
		if err != nil {
			return nil, err
		}
		adds = append(adds, mutate.Addendum{Layer: l})
	}
	return mutate.Append(empty.Image, adds...)
}

// writeMixedLayer writes to dst a layer of about size bytes of tar: per
// directory 200 text files of 0.5 to 8.5 KiB and a 2 MiB file half random,
// half text, as an image's /usr is a mix of many small files and some
// binaries.
func writeMixedLayer(dst string, seed uint64, size int64) (err error) {
	f, err := os.Create(dst)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, f.Close()) }()
	zw, _ := gzip.NewWriterLevel(f, gzip.BestSpeed)
	tw := tar.NewWriter(zw)
	rng := rand.New(rand.NewPCG(seed, 1))
	text := []byte(strings.Repeat("the quick brown fox jumps over the lazy dog\n", 1<<15))
	mtime := time.Unix(1700000000, 0)
	var written int64
	write := func(name string, data []byte) error {
		written += int64(len(data)) + 512
		if err := tw.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Size: int64(len(data)), ModTime: mtime, Typeflag: tar.TypeReg}); err != nil {
			return err
		}
		_, err := tw.Write(data)
		return err
	}
	for i := 0; written < size; i++ {
		dir := fmt.Sprintf("usr/share/l%d/d%03d/", seed, i)
		if err := tw.WriteHeader(&tar.Header{Name: dir, Mode: 0o755, ModTime: mtime, Typeflag: tar.TypeDir}); err != nil {
			return err
		}
		for j := range 200 {
			if err := write(fmt.Sprintf("%sf%d", dir, j), text[:512+rng.IntN(8<<10)]); err != nil {
				return err
			}
		}
		bin := make([]byte, 2<<20)
		for k := 0; k < len(bin)/2; k += 8 {
			v := rng.Uint64()
			for x := range 8 {
				bin[k+x] = byte(v >> (8 * x))
			}
		}
		copy(bin[len(bin)/2:], text)
		if err := write(dir+"bin", bin); err != nil {
			return err
		}
	}
	return errors.Join(tw.Close(), zw.Close())
}
