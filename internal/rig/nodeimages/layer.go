package nodeimages

import (
	"archive/tar"
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"strings"
	"time"
)

// writeFileLayer writes to dst a gzip-compressed layer tar holding the
// executable src at the absolute path inImage, with its parent directories:
// root-owned, mode 0755. Every entry has the Unix epoch as its time, so a
// binary that did not change gives the same layer digest and containerd
// keeps one copy.
func writeFileLayer(dst, src, inImage string) (err error) {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	fi, err := in.Stat()
	if err != nil {
		return err
	}
	out, err := os.Create(dst)
	if err != nil {
		return err
	}
	defer func() {
		if cerr := out.Close(); cerr != nil && err == nil {
			err = cerr
		}
	}()
	zw, err := gzip.NewWriterLevel(out, gzip.BestSpeed)
	if err != nil {
		return err
	}
	tw := tar.NewWriter(zw)
	epoch := time.Unix(0, 0)
	rel := strings.TrimPrefix(path.Clean(inImage), "/")
	if rel == "" || rel == "." {
		return fmt.Errorf("no file name in %q", inImage)
	}
	// Parent directories first, as `docker build` writes a COPY layer.
	var dir string
	for _, elem := range strings.Split(path.Dir(rel), "/") {
		if elem == "." {
			break
		}
		dir = path.Join(dir, elem)
		if err := tw.WriteHeader(&tar.Header{
			Typeflag: tar.TypeDir, Name: dir + "/", Mode: 0o755, ModTime: epoch,
		}); err != nil {
			return err
		}
	}
	if err := tw.WriteHeader(&tar.Header{
		Typeflag: tar.TypeReg, Name: rel, Mode: 0o755, Size: fi.Size(), ModTime: epoch,
	}); err != nil {
		return err
	}
	if _, err := io.Copy(tw, in); err != nil {
		return err
	}
	return errors.Join(tw.Close(), zw.Close())
}
