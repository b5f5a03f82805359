//go:build !linux

package snapshot

import (
	"context"
	"errors"
	"io"
	"os"
)

// WriteOptions configure [Write].
type WriteOptions struct {
	UID         uint32
	State       []StateFile
	Exclude     []string
	Upper       *os.File
	Concurrency int
}

// ReadOptions configure [Read].
type ReadOptions struct {
	UID, GID uint32
	State    func(StateFile) error
	Upper    func() (*os.File, error)
}

// Write is Linux only: it returns errors.ErrUnsupported.
func Write(context.Context, io.Writer, *os.File, WriteOptions) (*Stats, error) {
	return nil, errors.ErrUnsupported
}

// Read is Linux only: it returns errors.ErrUnsupported.
func Read(context.Context, io.Reader, *os.File, ReadOptions) (*Stats, error) {
	return nil, errors.ErrUnsupported
}
