package client

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"

	outputv1alpha1 "github.com/bashtask/bashtask-operator/api/output/v1alpha1"
)

// Demux reads the framed stream of LogOptions{Stream: "all"} (both
// streams in the order the agent read them; docs/output.md, "stdout and
// stderr in one stream") from r until it ends, and writes each frame's
// payload to stdout or stderr, in order. The frames are those of Docker's
// multiplexed attach stream: an 8-byte header (the stream, 1 stdout or 2
// stderr, three zero bytes, the payload's length as a big-endian uint32),
// then the payload, at most 1 MiB.
//
// It returns the payload bytes written. A reader that ends inside a frame
// is io.ErrUnexpectedEOF; an error of r (such as a LogReader's
// *StreamError) or of a writer is returned as it is, wrapped with the
// framed offset; a header of another stream or a longer payload is an
// error naming its offset. Demux over a LogReader resumes across
// reconnects like the reader: the reader's offsets count framed bytes.
func Demux(r io.Reader, stdout, stderr io.Writer) (int64, error) {
	var h [outputv1alpha1.FrameHeaderBytes]byte
	var written, at int64
	for {
		n, err := io.ReadFull(r, h[:])
		if errors.Is(err, io.EOF) {
			return written, nil
		}
		if err != nil {
			return written, fmt.Errorf("frame header at framed offset %d: %w", at+int64(n), err)
		}
		size := int64(binary.BigEndian.Uint32(h[4:]))
		var w io.Writer
		switch h[0] {
		case outputv1alpha1.FrameStdout:
			w = stdout
		case outputv1alpha1.FrameStderr:
			w = stderr
		}
		if w == nil || h[1] != 0 || h[2] != 0 || h[3] != 0 || size > outputv1alpha1.FramePayloadMaxBytes {
			return written, fmt.Errorf("frame header at framed offset %d: %v is not a frame of stdout (1) or stderr (2) of at most %d bytes", at, h, outputv1alpha1.FramePayloadMaxBytes)
		}
		at += outputv1alpha1.FrameHeaderBytes
		got, err := io.CopyN(w, r, size)
		written += got
		at += got
		if errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		if err != nil {
			return written, fmt.Errorf("frame payload at framed offset %d: %w", at, err)
		}
	}
}
