package image

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"runtime"
	"slices"

	"github.com/google/go-containerregistry/pkg/authn"
	kauth "github.com/google/go-containerregistry/pkg/authn/kubernetes"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
)

// MaxLayers is the most layers an image may have: Docker's overlay2
// limit, well below overlayfs's 500 lower layers, so that the short links
// of all of them ([Image.LowerDir], 19 bytes a layer) and the upper and
// work directories fit the one page (4096 bytes) that a mount's option
// string has on kernels without `lowerdir+` (before 6.8). An image with
// more fails with [ErrUnsupported].
const MaxLayers = 128

// DefaultParallelLayers is how many layers of one image download and
// unpack at once when [StoreOptions.ParallelLayers] is 0.
const DefaultParallelLayers = 3

// StoreOptions configure a [Store]; the agent maps them from its flags.
type StoreOptions struct {
	// BudgetBytes is the store's disk budget: after a pull, the least
	// recently used images nothing holds are evicted until the unpacked
	// size of all layers (bytes of file data, holes not counted) is at
	// most this. An image larger than the budget alone fails with
	// [ErrOverBudget]. 0: no limit.
	BudgetBytes int64
	// Keychain gives the node's own registry credentials, tried after a
	// pull's [PullOptions.Keychain]; nil: none (anonymous).
	Keychain authn.Keychain
	// Mirrors lists, per registry host as references name it
	// ("docker.io" or "index.docker.io", "ghcr.io", "registry:5000"),
	// mirror hosts tried in order before the registry itself; a mirror
	// that fails in any way (not found included) passes to the next.
	Mirrors map[string][]string
	// CAPEM is a bundle of PEM certificates trusted for registries and
	// mirrors in addition to the system's.
	CAPEM []byte
	// CAFile is a file holding such a bundle; read by [Open].
	CAFile string
	// PlainHTTP lists registry hosts (host or host:port) spoken to over
	// plain HTTP, for a local registry. Loopback and private addresses
	// and localhost are plain HTTP without being listed (the registry
	// library's rule).
	PlainHTTP []string
	// UserAgent is sent to registries; "" is the library's own.
	UserAgent string
	// ParallelLayers bounds the layers of one image downloaded and
	// unpacked at once; 0 is [DefaultParallelLayers].
	ParallelLayers int
	// Registerer receives the store's metrics (names under
	// bashtask_agent_image_); nil: not registered.
	Registerer prometheus.Registerer
	// Hold lists digests (manifest digests, or digests a reference
	// resolved to) of images that [Open] holds before it evicts anything:
	// the images of the agent's workspaces, which the agent then acquires
	// ([Store.Acquire]) and lets go of these holds ([Store.ReleaseOpenHolds]).
	// A digest the store lacks is ignored.
	Hold []string
	// Platform overrides the platform looked for in an index; nil is
	// linux and the node's runtime.GOARCH (and GOARM's variant on arm).
	Platform *v1.Platform

	// transport, when set, is the HTTP transport (tests).
	transport http.RoundTripper
}

// PullOptions are one pull's choices.
type PullOptions struct {
	// Keychain gives this pull's credentials (a task's or workspace's
	// pull secrets, see [KeychainFromDockerConfigJSON]), tried before the
	// store's own; nil: only the store's.
	Keychain authn.Keychain
	// Progress, when set, is called as compressed bytes arrive with the
	// bytes done and the total of the image's layers (compressed, bytes);
	// layers already in the store count as done at once. It may be
	// called from several goroutines, one call at a time.
	Progress func(done, total int64)
}

// KeychainFromDockerConfigJSON returns the credentials of a pull secret
// of type kubernetes.io/dockerconfigjson: data is the bytes of its
// `.dockerconfigjson` key. Registries are matched as the kubelet matches
// them (host, port, path prefix and globs). It fails when data is not
// such a document.
func KeychainFromDockerConfigJSON(data []byte) (authn.Keychain, error) {
	var doc struct {
		Auths map[string]json.RawMessage `json:"auths"`
	}
	if err := json.Unmarshal(data, &doc); err != nil {
		return nil, fmt.Errorf("pull secret: %s is not a docker config JSON document: %w", corev1.DockerConfigJsonKey, err)
	}
	if doc.Auths == nil {
		return nil, fmt.Errorf("pull secret: %s has no \"auths\"", corev1.DockerConfigJsonKey)
	}
	return kauth.NewFromPullSecrets(context.Background(), []corev1.Secret{{
		Type: corev1.SecretTypeDockerConfigJson,
		Data: map[string][]byte{corev1.DockerConfigJsonKey: data},
	}})
}

// nodePlatform is linux and the node's architecture.
func nodePlatform() v1.Platform {
	p := v1.Platform{OS: "linux", Architecture: runtime.GOARCH}
	switch runtime.GOARCH {
	case "arm":
		p.Variant = "v7"
	case "arm64":
		p.Variant = "v8"
	}
	return p
}

// platformMatches: the OS and architecture equal, and the variant when
// both name one (arm64's "v8" is often left out).
func platformMatches(want, have v1.Platform) bool {
	if want.OS != have.OS || want.Architecture != have.Architecture {
		return false
	}
	return want.Variant == "" || have.Variant == "" || want.Variant == have.Variant
}

// httpTransport is the transport to registries: the system's roots and
// the extra bundle.
func httpTransport(o StoreOptions) (http.RoundTripper, error) {
	if o.transport != nil {
		return o.transport, nil
	}
	t := remote.DefaultTransport.(*http.Transport).Clone()
	pem := slices.Clone(o.CAPEM)
	if o.CAFile != "" {
		b, err := os.ReadFile(o.CAFile)
		if err != nil {
			return nil, fmt.Errorf("image store: CA file: %w", err)
		}
		pem = append(append(pem, '\n'), b...)
	}
	if len(pem) == 0 {
		return t, nil
	}
	pool, err := x509.SystemCertPool()
	if err != nil {
		pool = x509.NewCertPool()
	}
	if !pool.AppendCertsFromPEM(pem) {
		return nil, errors.New("image store: the CA bundle holds no PEM certificate")
	}
	t.TLSClientConfig = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	return t, nil
}

// parseRef parses a reference, plain HTTP when its registry is listed.
func parseRef(ref string, plain []string) (name.Reference, error) {
	r, err := name.ParseReference(ref)
	if err != nil {
		return nil, fmt.Errorf("%w: image reference %q: %w", ErrNotFound, ref, err)
	}
	if !slices.Contains(plain, r.Context().RegistryStr()) {
		return r, nil
	}
	return name.ParseReference(ref, name.Insecure)
}

// candidates are the references a pull tries: the registry's mirrors in
// order, then ref itself.
func candidates(ref name.Reference, mirrors map[string][]string, plain []string) []name.Reference {
	host := ref.Context().RegistryStr()
	hosts := mirrors[host]
	if host == name.DefaultRegistry {
		hosts = append(slices.Clone(hosts), mirrors["docker.io"]...)
	}
	var out []name.Reference
	for _, m := range hosts {
		s := m + "/" + ref.Context().RepositoryStr() + sep(ref) + ref.Identifier()
		var opts []name.Option
		if slices.Contains(plain, m) {
			opts = append(opts, name.Insecure)
		}
		if r, err := name.ParseReference(s, opts...); err == nil {
			out = append(out, r)
		}
	}
	return append(out, ref)
}

func sep(ref name.Reference) string {
	if _, ok := ref.(name.Digest); ok {
		return "@"
	}
	return ":"
}
