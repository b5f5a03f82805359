package agent

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	agentv1 "github.com/bashtask/bashtask-operator/api/agent/v1"
	"github.com/bashtask/bashtask-operator/api/v1alpha1"
	"github.com/bashtask/bashtask-operator/executor"
	"github.com/bashtask/bashtask-operator/executor/image"
)

// Defaults of ImageConfig fields left zero (docs/images.md, "On the
// agent").
const (
	// DefaultImageCacheBytes is the default of --image-cache-size: 20 GiB
	// holds several language and tool images (a Python or Node image
	// unpacks to about 1 GiB, a CUDA image to about 10 GiB) and is a fifth
	// of a common 100 GiB node disk, below the kubelet's image garbage
	// collection threshold of 85 %.
	DefaultImageCacheBytes = 20 << 30
	// DefaultImageFailureTTL is how long a pull that failed for good
	// (not found, unauthorized, unsupported, too large) is answered from
	// memory, without the registry: a request within it gets the same
	// image_failure; the next one after it pulls again. The kubelet's
	// longest image pull backoff.
	DefaultImageFailureTTL = 5 * time.Minute
	// DefaultImageRetryInitial and DefaultImageRetryMax shape the backoff
	// of a pull that failed for a retryable cause (the network, a
	// registry's 5xx): doubled after each failure, capped.
	DefaultImageRetryInitial = 2 * time.Second
	DefaultImageRetryMax     = 2 * time.Minute
)

// ImageConfig is the agent's image configuration (the --image-* flags,
// docs/images.md, "On the agent").
type ImageConfig struct {
	// CacheDir is the image store's root; "" means <StateDir>/images.
	CacheDir string
	// CacheBytes is the store's disk budget in bytes (unpacked layers);
	// 0 means DefaultImageCacheBytes, a negative value no limit.
	CacheBytes int64
	// DefaultImage is the image of a task or workspace whose request
	// names none; "" means the node's root file system.
	DefaultImage string
	// Mirrors, CAFile and PlainHTTP are image.StoreOptions' (the
	// --registry-mirror, --registry-ca-file and --insecure-registry
	// flags).
	Mirrors   map[string][]string
	CAFile    string
	PlainHTTP []string
	// Registerer receives the store's metrics; nil: not registered.
	Registerer prometheus.Registerer
	// FailureTTL, RetryInitial and RetryMax: zero means the defaults
	// above.
	FailureTTL, RetryInitial, RetryMax time.Duration
}

// errImagesNeedTenant refuses an image at the process level.
var errImagesNeedTenant = status.Error(codes.FailedPrecondition,
	"images need the tenant isolation level (--isolation=tenant): this agent runs tasks at the process level, on the node's root file system")

// images is the agent's side of the image store: the pulls it runs in
// the background for Start and EnsureWorkspace, the failures it
// remembers, and which credentials may read which stored image.
type images struct {
	store *image.Store // nil at the process level
	cfg   ImageConfig
	log   *slog.Logger
	ctx   context.Context // ends the background pulls (Close)
	stop  context.CancelFunc

	mu    sync.Mutex
	pulls map[string]*pullJob // by pullKey
	// readers are, per digest (manifest and resolved), the hashes of the
	// credentials known to read the image: the pull's, and those a
	// registry check let through; "" for an anonymous pull, which
	// everyone may use.
	readers map[string]map[string]bool
}

// pullJob is one pull in the background, or its remembered end.
type pullJob struct {
	ref      string // what is pulled: the reference, or repo@digest
	keychain authn.Keychain
	creds    string // the credentials' hash
	// state, guarded by images.mu:
	status   *agentv1.ImageStatus
	im       *image.Image // the job's hold once pulled, until expiry
	failure  *agentv1.ImageFailure
	expires  time.Time // of a failure or a done pull
	lastAsk  time.Time
	finished bool
}

// imageTarget is what a request's ImageSpec resolves to on this agent.
type imageTarget struct {
	// ref is what to pull ("" for the node's root), reference the
	// request's (or the default) as the status reports it.
	ref, reference string
	// creds is the hash of the request's pull secrets ("" for none),
	// keychain their credentials.
	creds    string
	keychain authn.Keychain
	// rootInside is the request's image.root_inside (docs/images.md,
	// "Root inside").
	rootInside bool
}

// newImages opens the store at the tenant level, holding the digests of
// hold until the caller acquired them (ReleaseOpenHolds).
func newImages(cfg ImageConfig, stateDir string, tenant bool, hold []string, log *slog.Logger) (*images, error) {
	m := &images{cfg: cfg, log: log, pulls: map[string]*pullJob{}, readers: map[string]map[string]bool{}}
	m.ctx, m.stop = context.WithCancel(context.Background())
	m.cfg.FailureTTL = cmpOr(cfg.FailureTTL, DefaultImageFailureTTL)
	m.cfg.RetryInitial = cmpOr(cfg.RetryInitial, DefaultImageRetryInitial)
	m.cfg.RetryMax = cmpOr(cfg.RetryMax, DefaultImageRetryMax)
	if !tenant {
		if cfg.DefaultImage != "" {
			return nil, errors.New("agent: a default image (--default-image) needs the tenant isolation level (--isolation=tenant)")
		}
		return m, nil
	}
	if cfg.DefaultImage != "" {
		if _, err := name.ParseReference(cfg.DefaultImage); err != nil {
			return nil, fmt.Errorf("agent: --default-image %q: %w", cfg.DefaultImage, err)
		}
	}
	budget := cmpOr(cfg.CacheBytes, DefaultImageCacheBytes)
	if budget < 0 {
		budget = 0
	}
	dir := cfg.CacheDir
	if dir == "" {
		dir = stateDir + "/images"
	}
	st, err := image.Open(dir, image.StoreOptions{
		BudgetBytes: budget, Mirrors: cfg.Mirrors, CAFile: cfg.CAFile, PlainHTTP: cfg.PlainHTTP,
		Registerer: cfg.Registerer, Hold: hold, UserAgent: "bashtask-agent",
	})
	if err != nil {
		return nil, fmt.Errorf("agent: opening the image store: %w", err)
	}
	m.store = st
	return m, nil
}

// close ends the background pulls and releases the store; calling it
// again does nothing.
func (m *images) close() error {
	m.stop()
	m.mu.Lock()
	for _, j := range m.pulls {
		if j.im != nil {
			j.im.Release()
			j.im = nil
		}
	}
	m.mu.Unlock()
	if m.store == nil {
		return nil
	}
	return m.store.Close()
}

// target resolves spec against the agent's default. Bad input (a
// malformed reference or digest, an unreadable pull secret) is an
// INVALID_ARGUMENT naming the field; an image at the process level is
// refused.
func (m *images) target(spec *agentv1.ImageSpec) (imageTarget, error) {
	t := imageTarget{reference: spec.GetReference(), rootInside: spec.GetRootInside()}
	switch {
	case spec.GetNodeRoot():
		return imageTarget{}, errRootInsideNodeRoot(spec)
	case spec == nil || spec.GetReference() == "":
		if spec.GetDigest() != "" {
			return imageTarget{}, status.Error(codes.InvalidArgument, "image.digest needs image.reference")
		}
		if m.cfg.DefaultImage == "" {
			return imageTarget{}, errRootInsideNodeRoot(spec)
		}
		t.reference = m.cfg.DefaultImage
	}
	if m.store == nil {
		return imageTarget{}, errImagesNeedTenant
	}
	if t.rootInside {
		if err := executor.UserNamespaces(); err != nil {
			return imageTarget{}, status.Errorf(codes.FailedPrecondition, "image.root_inside: %v", err)
		}
	}
	r, err := name.ParseReference(t.reference)
	if err != nil {
		return imageTarget{}, status.Errorf(codes.InvalidArgument, "image.reference %q: %v", t.reference, err)
	}
	t.ref = t.reference
	if d := spec.GetDigest(); d != "" {
		dr, err := name.NewDigest(r.Context().Name() + "@" + d)
		if err != nil {
			return imageTarget{}, status.Errorf(codes.InvalidArgument, "image.digest %q: want sha256:<64 hex digits>: %v", d, err)
		}
		t.ref = dr.String() // the digest, never the tag
	}
	if t.keychain, t.creds, err = pullKeychain(spec.GetPullSecrets()); err != nil {
		return imageTarget{}, status.Error(codes.InvalidArgument, err.Error())
	}
	return t, nil
}

// pullKeychain is the keychain of a request's pull secrets, the first
// matching secret winning, and the hash naming those credentials ("" for
// none: an anonymous pull).
func pullKeychain(secrets [][]byte) (authn.Keychain, string, error) {
	if len(secrets) == 0 {
		return nil, "", nil
	}
	h := sha256.New()
	keys := make([]authn.Keychain, 0, len(secrets))
	for i, b := range secrets {
		k, err := image.KeychainFromDockerConfigJSON(b)
		if err != nil {
			return nil, "", fmt.Errorf("image.pull_secrets[%d]: %w", i, err)
		}
		keys = append(keys, k)
		fmt.Fprintf(h, "%d:", len(b))
		h.Write(b)
	}
	return authn.NewMultiKeychain(keys...), hex.EncodeToString(h.Sum(nil)), nil
}

// imageAnswer is the outcome of a request for an image: held (im), or
// the pull under way (pull), or its failure (failure); all nil for the
// node's root file system.
type imageAnswer struct {
	im      *image.Image
	target  imageTarget
	pull    *agentv1.ImageStatus
	failure *agentv1.ImageFailure
}

// status is the ImageStatus of a held image.
func (a *imageAnswer) status() *agentv1.ImageStatus {
	if a.im == nil {
		return nil
	}
	return &agentv1.ImageStatus{Reference: a.target.reference, Digest: a.im.Digest, Pulled: true}
}

// request answers a Start or EnsureWorkspace for spec at once: the image
// held when the node has it and the request's credentials may read it,
// else the pull started (or joined) in the background, or the failure it
// ended with. The caller releases answer.im.
func (m *images) request(spec *agentv1.ImageSpec) (*imageAnswer, error) {
	t, err := m.target(spec)
	if err != nil || t.ref == "" {
		return &imageAnswer{target: t}, err
	}
	if _, byDigest := mustParse(t.ref).(name.Digest); byDigest {
		if im := m.acquireAllowed(mustParse(t.ref).Identifier(), t.creds); im != nil {
			return &imageAnswer{im: im, target: t}, nil
		}
	}
	key := t.ref + "\x00" + t.creds
	m.mu.Lock()
	defer m.mu.Unlock()
	now := time.Now()
	j := m.pulls[key]
	if j != nil && j.finished && now.After(j.expires) {
		m.dropLocked(key, j)
		j = nil
	}
	if j == nil {
		j = &pullJob{ref: t.ref, keychain: t.keychain, creds: t.creds, status: &agentv1.ImageStatus{Reference: t.reference}}
		m.pulls[key] = j
		go m.run(key, j)
	}
	j.lastAsk = now
	switch {
	case j.failure != nil:
		return &imageAnswer{target: t, failure: j.failure}, nil
	case j.im != nil:
		if im, err := m.store.Acquire(j.im.ManifestDigest); err == nil {
			im.Digest = j.im.Digest
			return &imageAnswer{im: im, target: t}, nil
		}
	}
	return &imageAnswer{target: t, pull: proto.CloneOf(j.status)}, nil
}

// mustParse parses a reference target already checked.
func mustParse(ref string) name.Reference {
	r, _ := name.ParseReference(ref)
	return r
}

// acquireAllowed holds the stored image of digest when the credentials
// creds are known to read it; nil otherwise (not stored, or a check with
// the registry is due first).
func (m *images) acquireAllowed(digest, creds string) *image.Image {
	m.mu.Lock()
	r := m.readers[digest]
	ok := r[""] || r[creds]
	m.mu.Unlock()
	if !ok {
		return nil
	}
	im, err := m.store.Acquire(digest)
	if err != nil {
		return nil
	}
	return im
}

// run is a pull job's goroutine: pull (or check the credentials of a
// stored image) until it succeeds, fails for good, or nobody asked for
// it within the failure TTL; a retryable error waits with backoff and is
// reported in the status's message.
func (m *images) run(key string, j *pullJob) {
	wait := m.cfg.RetryInitial
	for {
		im, err := m.fetch(j)
		m.mu.Lock()
		if err == nil {
			m.doneLocked(j, im)
			m.expireLocked(key, j)
			m.mu.Unlock()
			return
		}
		if reason, permanent := apiImageReason(err); permanent {
			j.failure = &agentv1.ImageFailure{Reason: reason, Message: failureMessage(j.ref, err)}
			j.finished = true
			m.expireLocked(key, j)
			m.mu.Unlock()
			m.log.Info("image pull failed", "image", j.ref, "reason", reason, "err", err)
			return
		}
		j.status.Message = failureMessage(j.ref, err)
		idle := time.Since(j.lastAsk) > m.cfg.FailureTTL
		if idle {
			m.dropLocked(key, j)
		}
		m.mu.Unlock()
		if idle {
			return
		}
		m.log.Warn("image pull failed; retrying", "image", j.ref, "in", wait, "err", err)
		select {
		case <-time.After(wait):
		case <-m.ctx.Done():
			return
		}
		wait = min(2*wait, m.cfg.RetryMax)
	}
}

// fetch is one try of a job: a stored image by digest is checked with
// the registry under the job's credentials before it is handed out;
// anything else is pulled with them.
func (m *images) fetch(j *pullJob) (*image.Image, error) {
	o := image.PullOptions{Keychain: j.keychain, Progress: func(done, total int64) {
		m.mu.Lock()
		j.status.DownloadedBytes, j.status.TotalBytes = done, total
		m.mu.Unlock()
	}}
	if d, ok := mustParse(j.ref).(name.Digest); ok {
		if im, err := m.store.Acquire(d.DigestStr()); err == nil {
			if err := m.store.Authorize(m.ctx, j.ref, o); err != nil {
				im.Release()
				return nil, err
			}
			return im, nil
		}
	}
	return m.store.Pull(m.ctx, j.ref, o)
}

// doneLocked keeps a pulled image held by its job until the job expires
// (a tag resolved stays resolved that long), and notes its credentials
// as readers of it.
func (m *images) doneLocked(j *pullJob, im *image.Image) {
	j.im, j.finished = im, true
	j.status.Digest, j.status.Pulled, j.status.Message = im.Digest, true, ""
	for _, d := range []string{im.Digest, im.ManifestDigest} {
		if m.readers[d] == nil {
			m.readers[d] = map[string]bool{}
		}
		m.readers[d][j.creds] = true
	}
}

// expireLocked makes a finished job expire after the failure TTL: its
// failure is forgotten, or its hold on the image it pulled let go, even
// when nobody asks for it again.
func (m *images) expireLocked(key string, j *pullJob) {
	j.expires = time.Now().Add(m.cfg.FailureTTL)
	time.AfterFunc(m.cfg.FailureTTL, func() {
		m.mu.Lock()
		defer m.mu.Unlock()
		if m.pulls[key] == j {
			m.dropLocked(key, j)
		}
	})
}

// dropLocked forgets a job and lets go of its hold.
func (m *images) dropLocked(key string, j *pullJob) {
	if m.pulls[key] == j {
		delete(m.pulls, key)
	}
	if j.im != nil {
		j.im.Release()
		j.im = nil
	}
}

// apiImageReason maps a pull error to the API's image failure reason
// (api/v1alpha1/image_types.go) and whether it is final. Content the
// store refuses (image.ErrInvalid) is ImageUnsupported: the image cannot
// run on this node, and pulling again fetches the same bytes.
func apiImageReason(err error) (string, bool) {
	switch image.Reason(err) {
	case image.ReasonNotFound:
		return string(v1alpha1.ReasonImageNotFound), true
	case image.ReasonUnauthorized:
		return string(v1alpha1.ReasonImageUnauthorized), true
	case image.ReasonUnsupported, image.ReasonInvalid:
		return string(v1alpha1.ReasonImageUnsupported), true
	case image.ReasonOverBudget:
		return string(v1alpha1.ReasonImageTooLarge), true
	}
	return "", false
}

// failureMessage is a pull error's message naming the reference.
func failureMessage(ref string, err error) string {
	msg := err.Error()
	if strings.Contains(msg, ref) {
		return msg
	}
	return "image " + ref + ": " + msg
}

// errRootInsideNodeRoot is the INVALID_ARGUMENT of image.root_inside on
// the node's root file system (node_root, or no image and no
// --default-image), nil without root_inside: root inside needs an
// image's idmapped layers.
func errRootInsideNodeRoot(spec *agentv1.ImageSpec) error {
	if !spec.GetRootInside() {
		return nil
	}
	return status.Error(codes.InvalidArgument, "image.root_inside needs an image (a reference, or the agent's --default-image), not the node's root file system")
}
