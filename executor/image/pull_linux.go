//go:build linux

package image

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"golang.org/x/sync/errgroup"
)

// source is a resolved image.
type source struct {
	ref      string
	digest   string // what the reference resolved to
	manifest string // the platform image manifest's digest
	img      v1.Image
}

// layerInfo is one layer to fetch.
type layerInfo struct {
	layer      v1.Layer
	digest     string // compressed
	diffID     string
	compressed int64
	mediaType  types.MediaType
}

// Pull resolves ref (a tag is resolved to its manifest digest once; a
// digest reference, `repo@sha256:...`, never consults a tag and is served
// from the store without a registry when the store has it), picks the
// image for linux and the node's architecture from an index, fetches its
// config and the layers the store lacks (each once per node, however many
// pulls want it at the same time), and returns the image held (see
// [Image.Release]). The registry's mirrors are tried first.
//
// Errors: [ErrNotFound], [ErrUnauthorized], [ErrUnsupported] (a
// [PlatformError], a media type, more than [MaxLayers] layers),
// [ErrOverBudget] (a [BudgetError]; nothing of the image is left
// behind), [ErrInvalid] (a [MemberError], or a digest mismatch); any
// other error is retryable. ctx bounds the whole pull.
func (s *Store) Pull(ctx context.Context, ref string, o PullOptions) (*Image, error) {
	r, err := parseRef(ref, s.opts.PlainHTTP)
	if err != nil {
		return nil, err
	}
	if d, ok := r.(name.Digest); ok {
		if im := s.holdByDigest(d.DigestStr(), ref); im != nil {
			s.m.hits.Inc()
			return im, nil
		}
	}
	src, err := s.resolve(ctx, r, o)
	if err != nil {
		return nil, err
	}
	if im := s.holdByDigest(src.manifest, ref); im != nil {
		s.noteDigest(im, src.digest)
		s.m.hits.Inc()
		return im, nil
	}
	return s.pullImage(ctx, src, o)
}

// Authorize asks the registry of ref (never a mirror) whether o's
// credentials may read it: a HEAD of its manifest. It is how a caller
// checks a request's credentials before handing out an image the store
// serves without a registry (a pull by digest of an image it has, which
// other credentials pulled). Errors are those of [Store.Pull]:
// [ErrNotFound], [ErrUnauthorized], or a retryable one.
func (s *Store) Authorize(ctx context.Context, ref string, o PullOptions) error {
	r, err := parseRef(ref, s.opts.PlainHTTP)
	if err != nil {
		return err
	}
	if _, err := remote.Head(r, s.remoteOptions(ctx, o)...); err != nil {
		return registryError("checking the manifest of "+r.String(), err)
	}
	return nil
}

// noteDigest records the digest a reference resolved to (an index's) as
// the image's too.
func (s *Store) noteDigest(im *Image, digest string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	im.Digest = digest
	if e := s.images[im.ManifestDigest]; e != nil && digest != e.rec.ManifestDigest && !slices.Contains(e.rec.Digests, digest) {
		e.rec.Digests = append(e.rec.Digests, digest)
		_ = s.writeRecord(e.rec)
	}
}

// remoteOptions are the registry options of one pull.
func (s *Store) remoteOptions(ctx context.Context, o PullOptions) []remote.Option {
	var keys []authn.Keychain
	for _, k := range []authn.Keychain{o.Keychain, s.opts.Keychain} {
		if k != nil {
			keys = append(keys, k)
		}
	}
	opts := []remote.Option{remote.WithContext(ctx), remote.WithTransport(s.transport)}
	if len(keys) > 0 {
		opts = append(opts, remote.WithAuthFromKeychain(authn.NewMultiKeychain(keys...)))
	}
	if s.opts.UserAgent != "" {
		opts = append(opts, remote.WithUserAgent(s.opts.UserAgent))
	}
	return opts
}

// resolve fetches the manifest from the first of the mirrors and the
// registry that has it; the error is the registry's own.
func (s *Store) resolve(ctx context.Context, r name.Reference, o PullOptions) (*source, error) {
	var err error
	for _, c := range candidates(r, s.opts.Mirrors, s.opts.PlainHTTP) {
		var d *remote.Descriptor
		d, err = remote.Get(c, s.remoteOptions(ctx, o)...)
		if err != nil {
			err = registryError("fetching the manifest of "+c.String(), err)
			continue
		}
		return s.pick(r.String(), d)
	}
	return nil, err
}

// pick chooses the node's image from an index, or checks a manifest.
func (s *Store) pick(ref string, d *remote.Descriptor) (*source, error) {
	src := &source{ref: ref, digest: d.Digest.String()}
	switch {
	case d.MediaType.IsIndex():
		idx, err := d.ImageIndex()
		if err != nil {
			return nil, registryError("reading the index of "+ref, err)
		}
		im, err := idx.IndexManifest()
		if err != nil {
			return nil, registryError("reading the index of "+ref, err)
		}
		var have []v1.Platform
		for _, m := range im.Manifests {
			if m.Platform == nil || !m.MediaType.IsImage() {
				continue
			}
			if platformMatches(s.platform, *m.Platform) {
				if src.img, err = idx.Image(m.Digest); err != nil {
					return nil, registryError("fetching the image of "+ref, err)
				}
				src.manifest = m.Digest.String()
				return src, nil
			}
			have = append(have, *m.Platform)
		}
		return nil, &PlatformError{Ref: ref, Want: s.platform, Have: have}
	case d.MediaType.IsImage():
		img, err := d.Image()
		if err != nil {
			return nil, registryError("reading the manifest of "+ref, err)
		}
		src.img, src.manifest = img, src.digest
		return src, nil
	}
	return nil, fmt.Errorf("%w: %s: manifest media type %q (an OCI or Docker schema 2 image or index is needed)", ErrUnsupported, ref, d.MediaType)
}

// describe reads the config and the layers' descriptions.
func (s *Store) describe(src *source) (*v1.ConfigFile, []layerInfo, error) {
	cf, err := src.img.ConfigFile()
	if err != nil {
		return nil, nil, registryError("fetching the config of "+src.ref, err)
	}
	if cf.OS != "" && cf.Architecture != "" && !platformMatches(s.platform, *cf.Platform()) {
		return nil, nil, &PlatformError{Ref: src.ref, Want: s.platform, Have: []v1.Platform{*cf.Platform()}}
	}
	ls, err := src.img.Layers()
	if err != nil {
		return nil, nil, registryError("reading the layers of "+src.ref, err)
	}
	if len(ls) > MaxLayers {
		return nil, nil, fmt.Errorf("%w: %s has %d layers, at most %d are mounted", ErrUnsupported, src.ref, len(ls), MaxLayers)
	}
	out := make([]layerInfo, 0, len(ls))
	for _, l := range ls {
		li, err := describeLayer(src.ref, l)
		if err != nil {
			return nil, nil, err
		}
		out = append(out, li)
	}
	return cf, out, nil
}

func describeLayer(ref string, l v1.Layer) (layerInfo, error) {
	li := layerInfo{layer: l}
	d, err := l.Digest()
	if err == nil {
		li.digest = d.String()
		var id v1.Hash
		if id, err = l.DiffID(); err == nil {
			li.diffID = id.String()
			if li.compressed, err = l.Size(); err == nil {
				li.mediaType, err = l.MediaType()
			}
		}
	}
	if err != nil {
		return li, registryError("describing a layer of "+ref, err)
	}
	switch li.mediaType {
	case types.DockerLayer, types.DockerUncompressedLayer, types.OCILayer, types.OCILayerZStd, types.OCIUncompressedLayer:
	default:
		return li, fmt.Errorf("%w: %s: layer %s has media type %q (only tar, tar+gzip and tar+zstd layers unpack)", ErrUnsupported, ref, li.digest, li.mediaType)
	}
	if id, err := v1.NewHash(li.diffID); err != nil || id.Algorithm != "sha256" {
		return li, fmt.Errorf("%w: %s: layer %s: diffID %q is not a sha256 digest", ErrUnsupported, ref, li.digest, li.diffID)
	}
	return li, nil
}

// pullImage fetches what the store lacks and records the image.
func (s *Store) pullImage(ctx context.Context, src *source, o PullOptions) (*Image, error) {
	cf, layers, err := s.describe(src)
	if err != nil {
		return nil, err
	}
	pins := make([]string, 0, len(layers))
	var pinsMu sync.Mutex
	defer func() { s.unpin(pins) }()
	prog := newProgress(layers, o.Progress)
	res, err := s.fetchLayers(ctx, src.ref, layers, prog, func(id string) {
		pinsMu.Lock()
		pins = append(pins, id)
		pinsMu.Unlock()
	})
	if err != nil {
		return nil, err
	}
	rec := record{ManifestDigest: src.manifest, Ref: src.ref, Config: cf.Config, LastUsed: time.Now()}
	if src.digest != src.manifest {
		rec.Digests = []string{src.digest}
	}
	for _, l := range layers {
		rec.DiffIDs = append(rec.DiffIDs, l.diffID)
	}
	im, err := s.record(rec)
	if err != nil {
		return nil, err
	}
	im.Ref, im.Digest, im.Hit, im.Unpacked = src.ref, src.digest, !res.fetched, res.counts
	if res.fetched {
		s.m.misses.Inc()
	} else {
		s.m.hits.Inc()
	}
	return im, nil
}

// layersResult is what fetchLayers did.
type layersResult struct {
	// fetched: some layer was missing.
	fetched bool
	// counts of the layers this pull unpacked.
	counts UnpackCounts
}

// fetchLayers pins every layer of the image, fetching those missing, up
// to ParallelLayers at once.
func (s *Store) fetchLayers(ctx context.Context, ref string, layers []layerInfo, prog *progress, pinned func(string)) (layersResult, error) {
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(cmpOr(s.opts.ParallelLayers, DefaultParallelLayers))
	var res layersResult
	var unpacked int64
	var mu sync.Mutex
	for _, l := range layers {
		g.Go(func() error {
			got, size, st, err := s.ensureLayer(gctx, l, prog)
			if err != nil {
				return err
			}
			pinned(l.diffID)
			mu.Lock()
			defer mu.Unlock()
			res.fetched = res.fetched || got
			if st != nil {
				res.counts.add(st.UnpackCounts)
			}
			unpacked += size
			if b := s.opts.BudgetBytes; b > 0 && unpacked > b {
				return &BudgetError{Ref: ref, Size: unpacked, Budget: b}
			}
			return nil
		})
	}
	err := g.Wait()
	return res, err
}

func cmpOr(v, d int) int {
	if v > 0 {
		return v
	}
	return d
}

// ensureLayer pins a layer, fetching it first when the store lacks it
// (one fetch per diffID at a time, shared by every pull that wants it;
// the fetching pull's pin comes with the layer). It returns whether this
// call waited for a fetch, the layer's size in bytes, and what this call
// unpacked (nil when another did).
func (s *Store) ensureLayer(ctx context.Context, l layerInfo, prog *progress) (bool, int64, *unpackStats, error) {
	fetched := false
	for {
		if size, ok := s.pin(l.diffID); ok {
			if !fetched {
				prog.add(l.compressed)
			}
			return fetched, size, nil, nil
		}
		fetched = true
		ran := false
		v, err, _ := s.flights.Do(l.diffID, func() (any, error) {
			ran = true
			return s.fetchLayer(ctx, l, prog)
		})
		switch {
		case err == nil && ran:
			if st := v.(*unpackStats); st != nil {
				return true, st.bytes, st, nil
			}
			// Present already: pinned by the loop.
		case err == nil:
			// Another pull fetched it; its bytes count as done here.
			prog.add(l.compressed)
		case errors.Is(err, context.Canceled) && ctx.Err() == nil:
			// Another pull's fetch was cancelled, not this one: try again.
		default:
			return fetched, 0, nil, err
		}
	}
}

// pin counts a pull's use of a present layer.
func (s *Store) pin(id string) (int64, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	l := s.layers[id]
	if l == nil {
		return 0, false
	}
	l.pins++
	return l.size, true
}

// unpin drops a pull's pins; a layer no image records then goes.
func (s *Store) unpin(ids []string) {
	s.mu.Lock()
	var gone []string
	for _, id := range ids {
		if l := s.layers[id]; l != nil {
			l.pins--
			gone = append(gone, s.maybeDropLayerLocked(id)...)
		}
	}
	s.updateGaugesLocked()
	s.mu.Unlock()
	s.removeAll(gone)
}

// record writes the image's record after its layers, holds the image and
// evicts down to the budget.
func (s *Store) record(rec record) (*Image, error) {
	s.mu.Lock()
	e := s.images[rec.ManifestDigest]
	if e == nil {
		for _, id := range rec.DiffIDs {
			rec.LayerBytes = append(rec.LayerBytes, s.layers[id].size)
		}
		if b := s.opts.BudgetBytes; b > 0 && rec.size() > b {
			s.mu.Unlock()
			return nil, &BudgetError{Ref: rec.Ref, Size: rec.size(), Budget: b}
		}
		if err := s.writeRecord(rec); err != nil {
			s.mu.Unlock()
			return nil, err
		}
		e = &imageEntry{rec: rec}
		s.images[rec.ManifestDigest] = e
		for _, id := range rec.DiffIDs {
			s.layers[id].users++
		}
	}
	e.rec.LastUsed = time.Now()
	im := s.holdLocked(e, rec.Ref, rec.ManifestDigest, false)
	gone := s.evictLocked()
	s.updateGaugesLocked()
	s.mu.Unlock()
	s.removeAll(gone)
	return im, nil
}

// progress sums the bytes of one pull for its callback.
type progress struct {
	mu    sync.Mutex
	done  int64
	total int64
	fn    func(done, total int64)
}

func newProgress(layers []layerInfo, fn func(done, total int64)) *progress {
	p := &progress{fn: fn}
	for _, l := range layers {
		p.total += l.compressed
	}
	return p
}

func (p *progress) add(n int64) {
	if p == nil || p.fn == nil || n == 0 {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.done = min(p.done+n, p.total)
	p.fn(p.done, p.total)
}
