package image

import (
	"errors"
	"fmt"
	"net/http"
	"strings"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"
)

// The kinds of pull failure a caller maps to a task's or a workspace's
// reason; test with errors.Is, or use [Reason]. Every error of [Store.Pull]
// that is none of these is retryable (the network, the registry's 5xx,
// the local disk). The registry's own message stays in the error text.
var (
	// ErrNotFound: the repository, the tag or the digest does not exist
	// (the registry answered 404, MANIFEST_UNKNOWN, NAME_UNKNOWN or
	// BLOB_UNKNOWN), or a reference to look up is not in the store.
	ErrNotFound = errors.New("image not found")
	// ErrUnauthorized: the registry refused the credentials, or asked for
	// some and none were given (401, 403, UNAUTHORIZED, DENIED).
	ErrUnauthorized = errors.New("image pull unauthorized")
	// ErrUnsupported: no image for linux and the node's architecture in an
	// index ([PlatformError]), a manifest or layer media type this store
	// does not unpack, or more layers than [MaxLayers].
	ErrUnsupported = errors.New("image not supported")
	// ErrOverBudget: the image's unpacked size alone is over the store's
	// budget ([BudgetError]).
	ErrOverBudget = errors.New("image larger than the image store's budget")
	// ErrInvalid: a layer holds a member the store refuses (a path out of
	// the layer, through a symbolic link, a hard link to a file that is
	// not in the layer; [MemberError]), is not a tar, or unpacks to
	// another digest than its diffID.
	ErrInvalid = errors.New("image content refused")
)

// Reasons [Reason] returns, in the style of a Kubernetes condition reason.
const (
	ReasonNotFound     = "ImageNotFound"
	ReasonUnauthorized = "ImagePullUnauthorized"
	ReasonUnsupported  = "ImageUnsupported"
	ReasonOverBudget   = "ImageOverBudget"
	ReasonInvalid      = "ImageInvalid"
	// ReasonRetryable: any other error; the pull may succeed when tried
	// again.
	ReasonRetryable = "ImagePullFailed"
)

// Reason names the kind of a pull error (one of the Reason constants);
// "" for nil.
func Reason(err error) string {
	switch {
	case err == nil:
		return ""
	case errors.Is(err, ErrNotFound):
		return ReasonNotFound
	case errors.Is(err, ErrUnauthorized):
		return ReasonUnauthorized
	case errors.Is(err, ErrUnsupported):
		return ReasonUnsupported
	case errors.Is(err, ErrOverBudget):
		return ReasonOverBudget
	case errors.Is(err, ErrInvalid):
		return ReasonInvalid
	}
	return ReasonRetryable
}

// Retryable reports whether err is none of the permanent kinds.
func Retryable(err error) bool { return Reason(err) == ReasonRetryable }

// PlatformError is an index without an image for the platform wanted. It
// matches [ErrUnsupported].
type PlatformError struct {
	// Ref is the reference pulled.
	Ref string
	// Want is the platform looked for: linux and the node's architecture.
	Want v1.Platform
	// Have are the platforms the index lists.
	Have []v1.Platform
}

func (e *PlatformError) Error() string {
	have := make([]string, 0, len(e.Have))
	for _, p := range e.Have {
		have = append(have, p.String())
	}
	return fmt.Sprintf("%v: %s has no image for %s (the index lists %s)", ErrUnsupported, e.Ref, e.Want.String(), strings.Join(have, ", "))
}

// Is makes errors.Is(err, ErrUnsupported) true.
func (e *PlatformError) Is(target error) bool { return target == ErrUnsupported }

// BudgetError is an image whose unpacked size alone exceeds the store's
// budget. It matches [ErrOverBudget].
type BudgetError struct {
	// Ref is the reference pulled.
	Ref string
	// Size is the image's unpacked size in bytes (so far, when the pull
	// stopped before its end).
	Size int64
	// Budget is the store's budget in bytes.
	Budget int64
}

func (e *BudgetError) Error() string {
	return fmt.Sprintf("%v: %s unpacks to at least %d bytes, the budget is %d bytes", ErrOverBudget, e.Ref, e.Size, e.Budget)
}

// Is makes errors.Is(err, ErrOverBudget) true.
func (e *BudgetError) Is(target error) bool { return target == ErrOverBudget }

// MemberError is a layer member the store refused. It matches
// [ErrInvalid].
type MemberError struct {
	// Layer is the layer's digest (the compressed blob's).
	Layer string
	// Member is the member's name as the layer's tar holds it.
	Member string
	// Err says why.
	Err error
}

func (e *MemberError) Error() string {
	return fmt.Sprintf("%v: layer %s: member %q: %v", ErrInvalid, e.Layer, e.Member, e.Err)
}

// Is makes errors.Is(err, ErrInvalid) true.
func (e *MemberError) Is(target error) bool { return target == ErrInvalid }

func (e *MemberError) Unwrap() error { return e.Err }

// registryError gives an error of the registry protocol its kind, keeping
// its text.
func registryError(what string, err error) error {
	var te *transport.Error
	if !errors.As(err, &te) {
		return fmt.Errorf("%s: %w", what, err)
	}
	kind := error(nil)
	switch te.StatusCode {
	case http.StatusNotFound:
		kind = ErrNotFound
	case http.StatusUnauthorized, http.StatusForbidden:
		kind = ErrUnauthorized
	}
	for _, d := range te.Errors {
		switch d.Code {
		case transport.ManifestUnknownErrorCode, transport.NameUnknownErrorCode, transport.BlobUnknownErrorCode:
			kind = ErrNotFound
		case transport.UnauthorizedErrorCode, transport.DeniedErrorCode:
			kind = ErrUnauthorized
		case transport.UnsupportedErrorCode:
			kind = ErrUnsupported
		}
	}
	if kind == nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	return fmt.Errorf("%w: %s: %w", kind, what, err)
}
