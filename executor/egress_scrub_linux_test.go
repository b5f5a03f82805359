//go:build linux

package executor

import (
	"io"
	"strings"
	"testing"
	"testing/iotest"
)

// The scrubbing reader replaces every occurrence, also one split across
// reads of one byte, and keeps the rest.
func TestScrubReader(t *testing.T) {
	in := "xxSECRETyySECRSECRETzSECRE"
	r := &scrubReader{src: io.NopCloser(iotest.OneByteReader(strings.NewReader(in))), old: []byte("SECRET"), new: []byte("[s]")}
	got, err := io.ReadAll(r)
	if err != nil {
		t.Fatal(err)
	}
	if want := "xx[s]yySECR[s]zSECRE"; string(got) != want {
		t.Errorf("got %q, want %q", got, want)
	}
}
