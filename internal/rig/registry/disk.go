package registry

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	ggcr "github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
)

// blobHandler keeps the blobs in a directory through go-containerregistry's
// disk handler, whose Put checks the blob's digest and size as it writes
// it. Its own Stat hashes the whole file on every HEAD and GET; this one
// takes the file's size: a file is only there after a checked Put.
type blobHandler struct {
	dir  string
	disk ggcr.BlobHandler
}

func newBlobHandler(dir string) *blobHandler {
	return &blobHandler{dir: dir, disk: ggcr.NewDiskBlobHandler(dir)}
}

func (b *blobHandler) path(h v1.Hash) string { return filepath.Join(b.dir, h.Algorithm, h.Hex) }

// Stat is the blob's size in bytes, or ggcr.ErrNotFound.
func (b *blobHandler) Stat(_ context.Context, _ string, h v1.Hash) (int64, error) {
	fi, err := os.Stat(b.path(h))
	if errors.Is(err, fs.ErrNotExist) {
		return 0, ggcr.ErrNotFound
	}
	if err != nil {
		return 0, err
	}
	return fi.Size(), nil
}

// Get opens the blob, or returns ggcr.ErrNotFound.
func (b *blobHandler) Get(_ context.Context, _ string, h v1.Hash) (io.ReadCloser, error) {
	f, err := os.Open(b.path(h))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, ggcr.ErrNotFound
	}
	return f, err
}

// Put writes the blob through the disk handler.
func (b *blobHandler) Put(ctx context.Context, repo string, h v1.Hash, rc io.ReadCloser) error {
	return b.disk.(ggcr.BlobPutHandler).Put(ctx, repo, h, rc)
}

// Delete removes the blob.
func (b *blobHandler) Delete(ctx context.Context, repo string, h v1.Hash) error {
	return b.disk.(ggcr.BlobDeleteHandler).Delete(ctx, repo, h)
}

// manifestRecord is a manifest pushed to the registry, as it was put.
type manifestRecord struct {
	Repo        string `json:"repo"`
	Ref         string `json:"ref"`
	ContentType string `json:"contentType"`
	Body        []byte `json:"body"`
}

// recordName is the file of a record: the time it was written, so that
// replaying in name order puts an index after its manifests and a tag's
// last push last, and a hash of the repository and reference, so that a
// newer record of the same tag replaces the older.
func recordName(repo, ref string, at time.Time) string {
	sum := sha256.Sum256([]byte(repo + "\x00" + ref))
	return fmt.Sprintf("%020d-%s.json", at.UnixNano(), hex.EncodeToString(sum[:8]))
}

// recordManifests wraps the registry h: every manifest it accepts (PUT,
// 201 Created) is written to dir's manifests directory before the client
// hears of it.
func recordManifests(dir string, h http.Handler) http.Handler {
	var mu sync.Mutex
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		repo, ref, ok := isManifestPath(req.URL.Path)
		if !ok || req.Method != http.MethodPut {
			h.ServeHTTP(w, req)
			return
		}
		body, err := io.ReadAll(req.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		req.Body = io.NopCloser(bytes.NewReader(body))
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		if rec.Code == http.StatusCreated {
			mu.Lock()
			err = writeRecord(dir, manifestRecord{Repo: repo, Ref: ref, ContentType: req.Header.Get("Content-Type"), Body: body})
			mu.Unlock()
			if err != nil {
				http.Error(w, "recording the manifest: "+err.Error(), http.StatusInternalServerError)
				return
			}
		}
		copyResponse(w, rec)
	})
}

func copyResponse(w http.ResponseWriter, rec *httptest.ResponseRecorder) {
	for k, v := range rec.Header() {
		w.Header()[k] = v
	}
	w.WriteHeader(rec.Code)
	_, _ = w.Write(rec.Body.Bytes())
}

// writeRecord writes r into dir's manifests directory (a temporary file
// renamed into place) and removes the older records of its repository and
// reference.
func writeRecord(dir string, r manifestRecord) error {
	b, err := json.Marshal(r)
	if err != nil {
		return err
	}
	md := manifestDir(dir)
	name := recordName(r.Repo, r.Ref, time.Now())
	tmp := filepath.Join(md, ".tmp-"+name)
	if err := os.WriteFile(tmp, b, 0o644); err != nil {
		return err
	}
	if err := os.Rename(tmp, filepath.Join(md, name)); err != nil {
		return err
	}
	suffix := name[strings.IndexByte(name, '-'):]
	older, err := filepath.Glob(filepath.Join(md, "*"+suffix))
	if err != nil {
		return err
	}
	var errs []error
	for _, o := range older {
		if filepath.Base(o) != name {
			errs = append(errs, os.Remove(o))
		}
	}
	return errors.Join(errs...)
}

// replayManifests puts the manifests recorded in dir into the registry h,
// oldest first. A record the registry refuses (its blobs removed by hand)
// is an error naming it.
func replayManifests(dir string, h http.Handler) error {
	entries, err := os.ReadDir(manifestDir(dir))
	if err != nil {
		return fmt.Errorf("registry: reading the manifests' records: %w", err)
	}
	var names []string
	for _, e := range entries {
		if !strings.HasPrefix(e.Name(), ".") && strings.HasSuffix(e.Name(), ".json") {
			names = append(names, e.Name())
		}
	}
	slices.Sort(names)
	for _, n := range names {
		if err := replayOne(filepath.Join(manifestDir(dir), n), h); err != nil {
			return fmt.Errorf("registry: replaying %s: %w", n, err)
		}
	}
	return nil
}

func replayOne(path string, h http.Handler) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	var r manifestRecord
	if err := json.Unmarshal(b, &r); err != nil {
		return err
	}
	req := httptest.NewRequest(http.MethodPut, "/v2/"+r.Repo+"/manifests/"+r.Ref, bytes.NewReader(r.Body))
	req.Header.Set("Content-Type", r.ContentType)
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	if rec.Code != http.StatusCreated {
		return fmt.Errorf("%s:%s: status %d: %s", r.Repo, r.Ref, rec.Code, strings.TrimSpace(rec.Body.String()))
	}
	return nil
}
