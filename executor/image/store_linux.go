//go:build linux

package image

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"golang.org/x/sync/singleflight"
	"golang.org/x/sys/unix"
)

// Store is a node's image store (see the package documentation for its
// layout). Its methods are safe for concurrent use.
type Store struct {
	root      string
	opts      StoreOptions
	platform  v1.Platform
	transport http.RoundTripper
	m         *metrics
	lock      *os.File
	flights   singleflight.Group

	mu     sync.Mutex
	images map[string]*imageEntry // by manifest digest
	layers map[string]*layerEntry // by diffID
	bytes  int64                  // unpacked bytes of every layer
	// openHolds are the entries Open held for StoreOptions.Hold.
	openHolds []*imageEntry
}

// imageEntry is one recorded image.
type imageEntry struct {
	rec   record
	holds int
}

// layerEntry is one unpacked layer.
type layerEntry struct {
	size  int64
	users int // recorded images that use it
	pins  int // pulls under way that use it
}

// record is an image's record, images/<digest>.json.
type record struct {
	// ManifestDigest is the platform image manifest's digest (the key).
	ManifestDigest string `json:"manifestDigest"`
	// Digests are the digests references resolved to (an index's too).
	Digests []string `json:"digests"`
	// Ref is the reference last pulled.
	Ref    string    `json:"ref"`
	Config v1.Config `json:"config"`
	// DiffIDs are the layers, base first as the image lists them.
	DiffIDs []string `json:"diffIDs"`
	// LayerBytes are their unpacked sizes in bytes.
	LayerBytes []int64   `json:"layerBytes"`
	LastUsed   time.Time `json:"lastUsed"`
}

func (r *record) size() int64 {
	var n int64
	for _, b := range r.LayerBytes {
		n += b
	}
	return n
}

// Directories of the root.
const (
	dirLayers = "layers"
	dirLinks  = "l"
	dirImages = "images"
	dirTmp    = "tmp"
	lockFile  = "lock"
)

// Open opens (creating it when missing) the store at root, a directory
// only root may enter (made or set 0700: layers hold set-ID files). It
// takes an exclusive lock on root/lock (one store per root: a second Open
// fails), removes what an interrupted pull left (tmp/), records whose
// layers are missing and layers no record uses, restores missing short
// links, and evicts down to the budget. It fails when root cannot be
// made, locked or read, or when the CA bundle is unreadable.
func Open(root string, o StoreOptions) (*Store, error) {
	if o.BudgetBytes < 0 {
		return nil, fmt.Errorf("image store: budget %d bytes: must be 0 (no limit) or more", o.BudgetBytes)
	}
	t, err := httpTransport(o)
	if err != nil {
		return nil, err
	}
	m, err := newMetrics(o.Registerer)
	if err != nil {
		return nil, fmt.Errorf("image store: metrics: %w", err)
	}
	s := &Store{root: root, opts: o, platform: nodePlatform(), transport: t, m: m,
		images: map[string]*imageEntry{}, layers: map[string]*layerEntry{}}
	if o.Platform != nil {
		s.platform = *o.Platform
	}
	if err := s.prepareRoot(); err != nil {
		return nil, err
	}
	if err := s.load(); err != nil {
		s.Close()
		return nil, err
	}
	return s, nil
}

// prepareRoot makes the directories, locks the root and empties tmp/.
func (s *Store) prepareRoot() error {
	if err := os.MkdirAll(s.root, 0o700); err != nil {
		return fmt.Errorf("image store: %w", err)
	}
	if err := os.Chmod(s.root, 0o700); err != nil {
		return fmt.Errorf("image store: %w", err)
	}
	f, err := os.OpenFile(filepath.Join(s.root, lockFile), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return fmt.Errorf("image store: %w", err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		f.Close()
		return fmt.Errorf("image store: %s is in use by another store: %w", s.root, err)
	}
	s.lock = f
	// Whatever is in tmp/ is a pull or a removal that did not finish.
	if err := os.RemoveAll(filepath.Join(s.root, dirTmp)); err != nil {
		return fmt.Errorf("image store: removing an interrupted pull's leftovers: %w", err)
	}
	for _, d := range []string{dirLayers, dirLinks, dirImages, dirTmp} {
		if err := os.MkdirAll(filepath.Join(s.root, d), 0o700); err != nil {
			return fmt.Errorf("image store: %w", err)
		}
	}
	return nil
}

// load reads the records and reconciles them with the layers on disk.
func (s *Store) load() error {
	recs, err := s.readRecords()
	if err != nil {
		return err
	}
	for _, r := range recs {
		complete := true
		for _, id := range r.DiffIDs {
			if fi, err := os.Lstat(s.layerDir(id)); err != nil || !fi.IsDir() {
				complete = false
			}
		}
		if !complete {
			_ = os.Remove(s.recordPath(r.ManifestDigest))
			continue
		}
		s.images[r.ManifestDigest] = &imageEntry{rec: r}
		for i, id := range r.DiffIDs {
			l := s.layers[id]
			if l == nil {
				l = &layerEntry{size: r.LayerBytes[i]}
				s.layers[id] = l
				s.bytes += l.size
			}
			l.users++
		}
	}
	if err := s.reconcileLayers(); err != nil {
		return err
	}
	s.mu.Lock()
	for _, d := range s.opts.Hold {
		if e := s.entryLocked(d); e != nil {
			e.holds++
			s.openHolds = append(s.openHolds, e)
		}
	}
	gone := s.evictLocked()
	s.updateGaugesLocked()
	s.mu.Unlock()
	s.removeAll(gone)
	return nil
}

// readRecords reads images/*.json; an unreadable record is removed.
func (s *Store) readRecords() ([]record, error) {
	ents, err := os.ReadDir(filepath.Join(s.root, dirImages))
	if err != nil {
		return nil, fmt.Errorf("image store: %w", err)
	}
	var out []record
	for _, e := range ents {
		p := filepath.Join(s.root, dirImages, e.Name())
		b, err := os.ReadFile(p)
		var r record
		if err == nil {
			err = json.Unmarshal(b, &r)
		}
		if err != nil || len(r.DiffIDs) != len(r.LayerBytes) || e.Name() != keyName(r.ManifestDigest)+".json" {
			_ = os.Remove(p)
			continue
		}
		out = append(out, r)
	}
	return out, nil
}

// reconcileLayers removes layers no record uses and short links to
// nothing, and makes missing links.
func (s *Store) reconcileLayers() error {
	ents, err := os.ReadDir(filepath.Join(s.root, dirLayers))
	if err != nil {
		return fmt.Errorf("image store: %w", err)
	}
	for _, e := range ents {
		if _, ok := s.layers[idFromKey(e.Name())]; !ok {
			if err := os.RemoveAll(filepath.Join(s.root, dirLayers, e.Name())); err != nil {
				return fmt.Errorf("image store: removing an unused layer: %w", err)
			}
		}
	}
	links, err := os.ReadDir(filepath.Join(s.root, dirLinks))
	if err != nil {
		return fmt.Errorf("image store: %w", err)
	}
	for _, e := range links {
		if _, err := os.Stat(filepath.Join(s.root, dirLinks, e.Name())); err != nil {
			_ = os.Remove(filepath.Join(s.root, dirLinks, e.Name()))
		}
	}
	for id := range s.layers {
		if err := s.makeLink(id); err != nil {
			return err
		}
	}
	return nil
}

// Close releases the store's lock. Images stay on disk for the next Open.
func (s *Store) Close() error {
	if s.lock == nil {
		return nil
	}
	err := s.lock.Close()
	s.lock = nil
	return err
}

// Root is the store's root directory, the working directory for a mount
// with [Image.LowerDir].
func (s *Store) Root() string { return s.root }

// Bytes is the unpacked size of every layer in the store, in bytes.
func (s *Store) Bytes() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.bytes
}

// ReleaseOpenHolds drops the holds [Open] took for [StoreOptions.Hold],
// once the caller acquired what it keeps; calling it again does nothing.
func (s *Store) ReleaseOpenHolds() {
	s.mu.Lock()
	held := s.openHolds
	s.openHolds = nil
	s.mu.Unlock()
	for _, e := range held {
		s.release(e)
	}
}

// entryLocked is the recorded image of either of its digests; nil when
// there is none.
func (s *Store) entryLocked(digest string) *imageEntry {
	if e := s.images[digest]; e != nil {
		return e
	}
	for _, c := range s.images {
		if slices.Contains(c.rec.Digests, digest) {
			return c
		}
	}
	return nil
}

// Acquire holds the stored image whose manifest digest, or a digest a
// reference resolved to, is digest ("sha256:..."), without any registry:
// it is not evicted until the returned image's Release. It fails with
// [ErrNotFound] when the store does not have it.
func (s *Store) Acquire(digest string) (*Image, error) {
	if im := s.holdByDigest(digest, ""); im != nil {
		return im, nil
	}
	return nil, fmt.Errorf("%w: %s is not in the image store", ErrNotFound, digest)
}

// holdByDigest holds a recorded image by either of its digests; nil when
// there is none. ref, when set, becomes its last reference.
func (s *Store) holdByDigest(digest, ref string) *Image {
	s.mu.Lock()
	defer s.mu.Unlock()
	e := s.entryLocked(digest)
	if e == nil {
		return nil
	}
	if ref == "" {
		ref = e.rec.Ref
	}
	e.rec.LastUsed = time.Now()
	e.rec.Ref = ref
	if !slices.Contains(e.rec.Digests, digest) && digest != e.rec.ManifestDigest {
		e.rec.Digests = append(e.rec.Digests, digest)
	}
	// The record's last use survives a restart; failing to write it
	// only makes the eviction order older.
	_ = s.writeRecord(e.rec)
	return s.holdLocked(e, ref, digest, true)
}

// holdLocked counts a hold and returns the image for it.
func (s *Store) holdLocked(e *imageEntry, ref, digest string, hit bool) *Image {
	e.holds++
	r := e.rec
	im := &Image{Ref: ref, Digest: digest, ManifestDigest: r.ManifestDigest, Config: r.Config, Size: r.size(), Hit: hit}
	if im.Digest == "" {
		im.Digest = r.ManifestDigest
	}
	for _, id := range slices.Backward(r.DiffIDs) {
		im.Layers = append(im.Layers, s.layerDir(id))
		im.Links = append(im.Links, linkName(id))
		im.DiffIDs = append(im.DiffIDs, id)
	}
	im.release = func() { s.release(e) }
	return im
}

// release drops a hold and evicts what the budget no longer allows.
func (s *Store) release(e *imageEntry) {
	s.mu.Lock()
	e.holds--
	e.rec.LastUsed = time.Now()
	gone := s.evictLocked()
	s.updateGaugesLocked()
	s.mu.Unlock()
	s.removeAll(gone)
}

// evictLocked removes the least recently used images nothing holds until
// the store is within its budget. It returns the layer directories to
// remove (moved to tmp/ already) once the lock is released.
func (s *Store) evictLocked() []string {
	var gone []string
	for s.opts.BudgetBytes > 0 && s.bytes > s.opts.BudgetBytes {
		var victim *imageEntry
		for _, e := range s.images {
			if e.holds == 0 && (victim == nil || e.rec.LastUsed.Before(victim.rec.LastUsed)) {
				victim = e
			}
		}
		if victim == nil {
			break
		}
		gone = append(gone, s.dropImageLocked(victim)...)
		s.m.evictions.Inc()
	}
	return gone
}

// dropImageLocked forgets an image and its layers that nothing else uses.
func (s *Store) dropImageLocked(e *imageEntry) []string {
	delete(s.images, e.rec.ManifestDigest)
	_ = os.Remove(s.recordPath(e.rec.ManifestDigest))
	var gone []string
	for _, id := range e.rec.DiffIDs {
		if l := s.layers[id]; l != nil {
			l.users--
			gone = append(gone, s.maybeDropLayerLocked(id)...)
		}
	}
	return gone
}

// maybeDropLayerLocked removes a layer no image and no pull uses: its
// link goes, its directory moves to tmp/ (removed by the caller, or by
// the next Open).
func (s *Store) maybeDropLayerLocked(id string) []string {
	l := s.layers[id]
	if l == nil || l.users > 0 || l.pins > 0 {
		return nil
	}
	delete(s.layers, id)
	s.bytes -= l.size
	_ = os.Remove(filepath.Join(s.root, linkName(id)))
	dst, err := os.MkdirTemp(filepath.Join(s.root, dirTmp), "gone-")
	if err != nil {
		_ = os.RemoveAll(s.layerDir(id))
		return nil
	}
	if err := os.Rename(s.layerDir(id), filepath.Join(dst, "l")); err != nil {
		_ = os.RemoveAll(s.layerDir(id))
	}
	return []string{dst}
}

// removeAll removes directories outside the lock.
func (s *Store) removeAll(dirs []string) {
	for _, d := range dirs {
		_ = os.RemoveAll(d)
	}
}

func (s *Store) updateGaugesLocked() {
	s.m.cacheBytes.Set(float64(s.bytes))
	s.m.images.Set(float64(len(s.images)))
}

// writeRecord writes an image's record atomically: a file in tmp/,
// synced, renamed over the old one, the directory synced.
func (s *Store) writeRecord(r record) error {
	b, err := json.Marshal(r)
	if err != nil {
		return err
	}
	f, err := os.CreateTemp(filepath.Join(s.root, dirTmp), "record-")
	if err != nil {
		return fmt.Errorf("image store: record: %w", err)
	}
	_, err = f.Write(b)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(f.Name(), s.recordPath(r.ManifestDigest))
	}
	if err != nil {
		_ = os.Remove(f.Name())
		return fmt.Errorf("image store: record: %w", err)
	}
	return syncDir(filepath.Join(s.root, dirImages))
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// makeLink makes l/<short> -> ../layers/<key> when missing.
func (s *Store) makeLink(id string) error {
	p := filepath.Join(s.root, linkName(id))
	target := filepath.Join("..", dirLayers, keyName(id))
	if got, err := os.Readlink(p); err == nil {
		if got == target {
			return nil
		}
		return fmt.Errorf("image store: short link %s is taken by %s (two layers share its 16 hex digits)", p, got)
	}
	if err := os.Symlink(target, p); err != nil && !errors.Is(err, fs.ErrExist) {
		return fmt.Errorf("image store: %w", err)
	}
	return nil
}

// keyName is a digest as a file name: "sha256-<hex>".
func keyName(digest string) string { return strings.Replace(digest, ":", "-", 1) }

// idFromKey is keyName's inverse.
func idFromKey(key string) string { return strings.Replace(key, "-", ":", 1) }

// linkName is a layer's short link relative to the root: "l/" and the
// first 16 hex digits of its diffID.
func linkName(id string) string {
	hex := id[strings.IndexByte(id, ':')+1:]
	return dirLinks + "/" + hex[:min(16, len(hex))]
}

func (s *Store) layerDir(id string) string {
	return filepath.Join(s.root, dirLayers, keyName(id))
}

func (s *Store) recordPath(digest string) string {
	return filepath.Join(s.root, dirImages, keyName(digest)+".json")
}
