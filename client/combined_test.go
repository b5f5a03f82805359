package client

import (
	"bytes"
	"errors"
	"io"
	"strings"
	"testing"
	"testing/iotest"
)

// orderWriter records every write with its stream, so a test sees the
// order the two writers were written in.
type orderWriter struct {
	log *[]string
	tag string
}

func (w orderWriter) Write(p []byte) (int, error) {
	*w.log = append(*w.log, w.tag+string(p))
	return len(p), nil
}

func frameOf(stream byte, payload string) []byte {
	n := len(payload)
	return append([]byte{stream, 0, 0, 0, byte(n >> 24), byte(n >> 16), byte(n >> 8), byte(n)}, payload...)
}

func TestDemux(t *testing.T) {
	var framed []byte
	for _, f := range []struct {
		stream  byte
		payload string
	}{{1, "out1\n"}, {2, "err1\n"}, {1, "out2\n"}, {2, "err2\n"}, {1, ""}} {
		framed = append(framed, frameOf(f.stream, f.payload)...)
	}
	var log []string
	// One byte a read: headers and payloads split anywhere.
	n, err := Demux(iotest.OneByteReader(bytes.NewReader(framed)), orderWriter{&log, "out:"}, orderWriter{&log, "err:"})
	if err != nil || n != 20 {
		t.Fatalf("Demux = %d, %v; want 20 bytes", n, err)
	}
	var out, errs bytes.Buffer
	var order []string
	for _, l := range log {
		order = append(order, l[:4])
		if l[:4] == "out:" {
			out.WriteString(l[4:])
		} else {
			errs.WriteString(l[4:])
		}
	}
	if out.String() != "out1\nout2\n" || errs.String() != "err1\nerr2\n" {
		t.Fatalf("stdout %q, stderr %q", out.String(), errs.String())
	}
	// The order of the writes is the frames': 5 bytes of each in turn.
	for i, tag := range order {
		if want := []string{"out:", "err:"}[i/5%2]; tag != want {
			t.Fatalf("write %d went to %s, want %s (writes %q)", i, tag, want, log)
		}
	}

	if _, err := Demux(bytes.NewReader(framed[:len(framed)-9]), io.Discard, io.Discard); !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Errorf("cut inside a payload: %v, want ErrUnexpectedEOF", err)
	}
	if _, err := Demux(bytes.NewReader(framed[:3]), io.Discard, io.Discard); !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Errorf("cut inside a header: %v, want ErrUnexpectedEOF", err)
	}
	if _, err := Demux(bytes.NewReader(frameOf(3, "x")), io.Discard, io.Discard); err == nil || !strings.Contains(err.Error(), "offset 0") {
		t.Errorf("stream 3: %v, want an error naming offset 0", err)
	}
	cause := &StreamError{Offset: 13, Message: "not kept"}
	_, err = Demux(io.MultiReader(bytes.NewReader(framed[:13]), iotest.ErrReader(cause)), io.Discard, io.Discard)
	var se *StreamError
	if !errors.As(err, &se) || se.Offset != 13 {
		t.Errorf("a reader's StreamError: %v, want it returned", err)
	}
}
