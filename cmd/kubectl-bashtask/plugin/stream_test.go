package plugin

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"k8s.io/utils/ptr"

	bashtaskv1alpha1 "github.com/bashtask/bashtask-operator/api/v1alpha1"
)

// snap is the status of a stream whose bytes so far are stream[:total],
// with a tail of the last tailLen bytes.
func snap(stream string, total, tailLen int) *bashtaskv1alpha1.StreamStatus {
	tailLen = min(tailLen, total)
	h := sha256.Sum256([]byte(stream[:total]))
	return &bashtaskv1alpha1.StreamStatus{
		Tail: ptr.To(stream[total-tailLen : total]), TotalBytes: ptr.To(int64(total)), Truncated: ptr.To(tailLen < total),
		SHA256: ptr.To(hex.EncodeToString(h[:])),
	}
}

func stored(s *bashtaskv1alpha1.StreamStatus, n int) *bashtaskv1alpha1.StreamStatus {
	s.Spill = &bashtaskv1alpha1.SpillRef{URL: ptr.To("file:///b/ns/t/uid/stdout"), Bytes: ptr.To(int64(n)), Complete: ptr.To(int64(n) == *s.TotalBytes)}
	return s
}

func TestStreamWriter(t *testing.T) {
	const stream = "0123456789abcdefghijklmnopqrstuvwxyz"
	tests := map[string]struct {
		complete  bool
		tailOK    bool
		snapshots []*bashtaskv1alpha1.StreamStatus // while running
		final     *bashtaskv1alpha1.StreamStatus
		object    string // what the bucket holds
		wantOut   string
		wantNotes []string
		wantErr   string
	}{
		"tails that overlap write each byte once": {
			complete:  true,
			snapshots: []*bashtaskv1alpha1.StreamStatus{snap(stream, 4, 10), snap(stream, 12, 10), snap(stream, 12, 10), snap(stream, 20, 10)},
			final:     snap(stream, 36, 20),
			wantOut:   stream,
		},
		"a gap defers the rest to the stored object": {
			complete:  true,
			snapshots: []*bashtaskv1alpha1.StreamStatus{snap(stream, 5, 5), snap(stream, 30, 5), snap(stream, 33, 5)},
			final:     stored(snap(stream, 36, 5), 36),
			object:    stream,
			wantOut:   stream,
			wantNotes: []string{"stdout: 20 bytes went past the status tail before they could be shown; the rest of stdout is written when the task ends, from storage"},
		},
		"a gap without an object: stop at the gap, exit non-zero": {
			complete:  true,
			snapshots: []*bashtaskv1alpha1.StreamStatus{snap(stream, 5, 5), snap(stream, 30, 5)},
			final:     snap(stream, 36, 5),
			wantOut:   stream[:5],
			wantNotes: []string{
				"stdout: 20 bytes went past the status tail before they could be shown; the rest of stdout is written when the task ends, from storage",
			},
			wantErr: "stdout: bytes 5 to 31 of 36 are not available (upload pending); wrote the first 5 bytes rather than a stream with a hole (add --tail-ok to accept the last 5 bytes after a note)",
		},
		"no object from the start: nothing written, exit non-zero": {
			complete: true,
			final:    snap(stream, 36, 5),
			wantOut:  "",
			wantErr:  "stdout: bytes 0 to 31 of 36 are not available (upload pending); wrote none of it rather than",
		},
		"a gap without an object, --tail-ok: the tail and a note": {
			complete:  true,
			tailOK:    true,
			snapshots: []*bashtaskv1alpha1.StreamStatus{snap(stream, 5, 5), snap(stream, 30, 5)},
			final:     snap(stream, 36, 5),
			wantOut:   stream[:5] + stream[31:],
			wantNotes: []string{
				"stdout: 20 bytes went past the status tail before they could be shown; the rest of stdout is written when the task ends, from storage",
				"stdout: bytes 5 to 31 of 36 are not available (upload pending); the last 5 bytes follow",
			},
		},
		"an object cut at the spill limit, then the tail": {
			complete: true,
			final:    stored(snap(stream, 36, 10), 30),
			object:   stream[:30],
			wantOut:  stream,
		},
		"an object cut at the spill limit before the tail: stop there": {
			complete: true,
			final:    stored(snap(stream, 36, 4), 20),
			object:   stream[:20],
			wantOut:  stream[:20],
			wantErr:  "stdout: bytes 20 to 32 of 36 are not available (the stored object ends where the stream passed spec.output.spillLimitBytes)",
		},
		"a sanitized tail without an object: stop": {
			complete: true,
			final:    &bashtaskv1alpha1.StreamStatus{Tail: ptr.To("ab\uFFFDc"), TotalBytes: ptr.To[int64](4), Sanitized: ptr.To(true)},
			wantErr:  "stdout: the exact bytes 0 to 4 of 4 cannot be written: its tail in status has invalid UTF-8 replaced by U+FFFD and upload pending",
		},
		"an object cut at the spill limit before the tail, --tail-ok": {
			complete: true,
			tailOK:   true,
			final:    stored(snap(stream, 36, 4), 20),
			object:   stream[:20],
			wantOut:  stream[:20] + stream[32:],
			wantNotes: []string{
				"stdout: bytes 20 to 32 of 36 are not available (the stored object ends where the stream passed spec.output.spillLimitBytes); the last 4 bytes follow",
			},
		},
		"an object shorter than status says": {
			complete: true,
			final:    stored(snap(stream, 36, 4), 36),
			object:   stream[:30],
			wantOut:  stream[:30],
			wantErr:  "ends after 30 bytes; status.stdout.spill.bytes says 36",
		},
		"an object that is not the stream": {
			complete: true,
			final:    stored(snap(stream, 36, 4), 36),
			object:   strings.ToUpper(stream),
			wantOut:  strings.ToUpper(stream),
			wantErr:  "stdout: the 36 bytes written have SHA-256",
		},
		"tail mode skips a gap and goes on": {
			snapshots: []*bashtaskv1alpha1.StreamStatus{snap(stream, 5, 5), snap(stream, 30, 5)},
			final:     stored(snap(stream, 36, 5), 36),
			object:    stream,
			wantOut:   stream[:5] + stream[25:30] + stream[31:],
			wantNotes: []string{
				"stdout: 20 bytes not shown (they went past the tail kept in status)",
				"stdout: 1 bytes not shown (they went past the tail kept in status)",
			},
		},
		"tail mode starting late": {
			snapshots: []*bashtaskv1alpha1.StreamStatus{snap(stream, 30, 10)},
			final:     snap(stream, 36, 10),
			wantOut:   stream[20:],
			wantNotes: []string{"stdout: 20 bytes not shown (they went past the tail kept in status)"},
		},
		"sanitized tail in complete mode waits for the object": {
			complete: true,
			snapshots: []*bashtaskv1alpha1.StreamStatus{
				{Tail: ptr.To("ab\uFFFD"), TotalBytes: ptr.To[int64](3), Sanitized: ptr.To(true)},
			},
			final: &bashtaskv1alpha1.StreamStatus{Tail: ptr.To("ab\uFFFDc"), TotalBytes: ptr.To[int64](4), Sanitized: ptr.To(true),
				Spill: &bashtaskv1alpha1.SpillRef{URL: ptr.To("file:///b/k"), Bytes: ptr.To[int64](4), Complete: ptr.To(true)}},
			object:    "ab\xffc",
			wantOut:   "ab\xffc",
			wantNotes: []string{"stdout is not valid UTF-8; it is written when the task ends, from storage"},
		},
		"empty stream": {
			complete: true,
			final:    &bashtaskv1alpha1.StreamStatus{},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			var out bytes.Buffer
			var notes []string
			note := func(format string, args ...any) { notes = append(notes, fmt.Sprintf(format, args...)) }
			w := newStreamWriter("stdout", &out, note, tc.complete)
			w.tailOK = tc.tailOK
			for _, s := range tc.snapshots {
				if err := w.update(s); err != nil {
					t.Fatalf("update: %v", err)
				}
			}
			fetch := func(_ context.Context, _ *bashtaskv1alpha1.SpillRef, offset int64) (io.ReadCloser, error) {
				return io.NopCloser(strings.NewReader(tc.object[offset:])), nil
			}
			err := w.finish(t.Context(), tc.final, fetch, "upload pending")
			if tc.wantErr == "" && err != nil || tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)) {
				t.Errorf("finish: %v, want error containing %q", err, tc.wantErr)
			}
			if diff := cmp.Diff(tc.wantOut, out.String()); diff != "" {
				t.Errorf("output (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tc.wantNotes, notes); diff != "" {
				t.Errorf("notes (-want +got):\n%s", diff)
			}
		})
	}
}
