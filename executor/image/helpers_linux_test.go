//go:build linux

package image

import (
	"archive/tar"
	"bytes"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	rigtestutil "github.com/bashtask/bashtask-operator/internal/rig/testutil"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// testRegistry is go-containerregistry's in-process registry behind
// httptest, counting the GETs of every blob and manifest path.
type testRegistry struct {
	host string
	srv  *httptest.Server

	mu   sync.Mutex
	gets map[string]int
	// blobDelay slows every blob GET (overlapping concurrent pulls).
	blobDelay time.Duration
}

func newTestRegistry(t testing.TB, wrap func(http.Handler) http.Handler) *testRegistry {
	t.Helper()
	r := &testRegistry{gets: map[string]int{}}
	h := registry.New(registry.Logger(log.New(io.Discard, "", 0)))
	if wrap != nil {
		h = wrap(h)
	}
	inner := h
	h = http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if req.Method == http.MethodGet {
			r.mu.Lock()
			r.gets[req.URL.Path]++
			d := r.blobDelay
			r.mu.Unlock()
			if strings.Contains(req.URL.Path, "/blobs/") {
				time.Sleep(d)
			}
		}
		inner.ServeHTTP(w, req)
	})
	r.srv = httptest.NewServer(h)
	t.Cleanup(r.srv.Close)
	r.host = strings.TrimPrefix(r.srv.URL, "http://")
	return r
}

// blobGets is how often the blob digest was fetched from any repository.
func (r *testRegistry) blobGets(digest string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for p, c := range r.gets {
		if strings.HasSuffix(p, "/blobs/"+digest) {
			n += c
		}
	}
	return n
}

func (r *testRegistry) pathGets(suffix string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for p, c := range r.gets {
		if strings.HasSuffix(p, suffix) {
			n += c
		}
	}
	return n
}

// member is one hand-written tar member.
type member struct {
	name     string
	typ      byte
	mode     int64
	uid, gid int
	data     string
	size     int64 // for zeros: a file of this many bytes, data at its start
	link     string
	xattrs   map[string]string
}

func tarBytes(t testing.TB, ms []member) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	mtime := time.Unix(1700000000, 0)
	for _, m := range ms {
		h := &tar.Header{Name: m.name, Typeflag: m.typ, Mode: m.mode, Uid: m.uid, Gid: m.gid, Linkname: m.link, ModTime: mtime, Format: tar.FormatPAX}
		if h.Typeflag == 0 {
			h.Typeflag = tar.TypeReg
		}
		if h.Mode == 0 {
			h.Mode = 0o644
		}
		body := []byte(m.data)
		if m.size > 0 {
			body = make([]byte, m.size)
			copy(body, m.data)
		}
		if h.Typeflag == tar.TypeReg {
			h.Size = int64(len(body))
		}
		if len(m.xattrs) > 0 {
			h.PAXRecords = map[string]string{}
			for k, v := range m.xattrs {
				h.PAXRecords[paxXattr+k] = v
			}
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if h.Typeflag == tar.TypeReg {
			if _, err := tw.Write(body); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// tarLayer is a gzip layer of the members.
func tarLayer(t testing.TB, ms ...member) v1.Layer {
	t.Helper()
	b := tarBytes(t, ms)
	l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil })
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// makeImage is an image of the layers (base first) for linux and arch.
func makeImage(t testing.TB, arch string, layers ...v1.Layer) v1.Image {
	t.Helper()
	img, err := mutate.AppendLayers(empty.Image, layers...)
	if err != nil {
		t.Fatal(err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", arch
	cf.Config.Env = []string{"PATH=/usr/bin:/bin"}
	cf.Config.WorkingDir = "/work"
	if img, err = mutate.ConfigFile(img, cf); err != nil {
		t.Fatal(err)
	}
	return img
}

// push writes img as host/repo:tag and returns its manifest digest.
func push(t testing.TB, host, repoTag string, img v1.Image) string {
	t.Helper()
	ref, err := name.ParseReference(host + "/" + repoTag)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(ref, img); err != nil {
		t.Fatal(err)
	}
	d, err := img.Digest()
	if err != nil {
		t.Fatal(err)
	}
	return d.String()
}

func needRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		rigtestutil.SkipUnlessStrict(t, "needs root: owners, whiteouts and trusted extended attributes")
	}
}

func openStore(t testing.TB, o StoreOptions) *Store {
	t.Helper()
	needRoot(t)
	s, err := Open(filepath.Join(t.TempDir(), "images"), o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// dirEntries lists a store directory's names.
func dirEntries(t testing.TB, dir string) []string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range ents {
		out = append(out, e.Name())
	}
	return out
}

func digestOf(t testing.TB, l v1.Layer) string {
	t.Helper()
	d, err := l.Digest()
	if err != nil {
		t.Fatal(err)
	}
	return d.String()
}

var arch = runtime.GOARCH
