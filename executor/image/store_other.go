//go:build !linux

package image

import (
	"context"
	"errors"
)

// Store is the node's image store; Linux only.
type Store struct{}

// Open is Linux only: it returns errors.ErrUnsupported.
func Open(string, StoreOptions) (*Store, error) { return nil, errors.ErrUnsupported }

// Pull is Linux only: it returns errors.ErrUnsupported.
func (*Store) Pull(context.Context, string, PullOptions) (*Image, error) {
	return nil, errors.ErrUnsupported
}

// Acquire is Linux only: it returns errors.ErrUnsupported.
func (*Store) Acquire(string) (*Image, error) { return nil, errors.ErrUnsupported }

// Close does nothing.
func (*Store) Close() error { return nil }

// Root is "".
func (*Store) Root() string { return "" }

// Bytes is 0.
func (*Store) Bytes() int64 { return 0 }

// Authorize is Linux only: it returns errors.ErrUnsupported.
func (*Store) Authorize(context.Context, string, PullOptions) error { return errors.ErrUnsupported }

// ReleaseOpenHolds does nothing.
func (*Store) ReleaseOpenHolds() {}
