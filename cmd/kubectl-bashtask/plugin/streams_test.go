package plugin

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"net/http"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	bashtaskv1alpha1 "github.com/bashtask/bashtask-operator/api/v1alpha1"
	btclient "github.com/bashtask/bashtask-operator/client"
)

// finalStatus is the status of a finished stream whose bytes are stream,
// with a tail of its last tailLen bytes.
func finalStatus(stream string, tailLen int) *bashtaskv1alpha1.StreamStatus {
	tailLen = min(tailLen, len(stream))
	h := sha256.Sum256([]byte(stream))
	return &bashtaskv1alpha1.StreamStatus{
		Tail: ptr.To(stream[len(stream)-tailLen:]), TotalBytes: ptr.To(int64(len(stream))), Truncated: ptr.To(tailLen < len(stream)),
		SHA256: ptr.To(hex.EncodeToString(h[:])),
	}
}

// readUpTo is what copyStream returns after writing got to out and
// stopping with err.
func readUpTo(out *bytes.Buffer, got string, err error) streamResult {
	h := sha256.New()
	h.Write([]byte(got))
	out.WriteString(got)
	return streamResult{written: int64(len(got)), hash: h, err: err}
}

func TestFinishStream(t *testing.T) {
	const stream = "0123456789abcdefghijklmnopqrstuvwxyz" // 36 bytes
	cut := func(at int64) error { return &btclient.StreamError{Offset: at, Message: "past the spill limit"} }
	tests := map[string]struct {
		status    *bashtaskv1alpha1.StreamStatus
		got       string // what the output API delivered
		err       error  // how it stopped
		tailOK    bool
		wantOut   string
		wantNotes string
		wantErr   string
	}{
		"read to its end": {status: finalStatus(stream, 5), got: stream, wantOut: stream},
		"empty stream":    {status: &bashtaskv1alpha1.StreamStatus{}, wantOut: ""},
		"no status":       {got: "", wantOut: ""},
		"a clean end short of totalBytes is an error": {
			status: finalStatus(stream, 5), got: stream[:30], wantOut: stream[:30],
			wantErr: "stdout: the output API ended the stream after 30 bytes, but status.stdout.totalBytes is 36",
		},
		"bytes that are not the stream's": {
			status: finalStatus(stream, 5), got: strings.ToUpper(stream), wantOut: strings.ToUpper(stream),
			wantErr: "stdout: the 36 bytes written have SHA-256",
		},
		"cut inside the tail: the tail holds the exact rest": {
			status: finalStatus(stream, 10), got: stream[:30], err: cut(30), wantOut: stream,
		},
		"cut inside the tail, and the result is not the stream": {
			status: finalStatus(stream, 10), got: strings.ToUpper(stream[:30]), err: cut(30), wantOut: strings.ToUpper(stream[:30]) + stream[30:],
			wantErr: "stdout: the 36 bytes written have SHA-256",
		},
		"cut before the tail: stop there, non-zero": {
			status: finalStatus(stream, 4), got: stream[:20], err: cut(20), wantOut: stream[:20],
			wantErr: "stdout: bytes 20 to 32 of 36 cannot be read: past the spill limit; wrote the first 20 bytes rather than a stream with a hole " +
				"(add --tail-ok to accept the last 4 bytes kept in status after a note)",
		},
		"nothing kept from the start": {
			status: finalStatus(stream, 4), err: cut(0), wantOut: "",
			wantErr: "stdout: bytes 0 to 32 of 36 cannot be read: past the spill limit; wrote none of it rather than",
		},
		"cut before the tail, --tail-ok: a note and the tail": {
			status: finalStatus(stream, 4), got: stream[:20], err: cut(20), tailOK: true, wantOut: stream[:20] + stream[32:],
			wantNotes: "kubectl-bashtask: stdout: bytes 20 to 32 of 36 cannot be read (past the spill limit); the last 4 bytes kept in status follow\n",
		},
		"a sanitized tail is not the stream's bytes": {
			status: &bashtaskv1alpha1.StreamStatus{Tail: ptr.To("ab\uFFFDc"), TotalBytes: ptr.To[int64](4), Sanitized: ptr.To(true)},
			got:    "a", err: cut(1), wantOut: "a",
			wantErr: "stdout: bytes 1 to 4 of 4 cannot be read: past the spill limit; wrote the first 1 bytes rather than a stream with a hole " +
				"(add --tail-ok to accept the last 6 bytes kept in status after a note, with U+FFFD in place of invalid UTF-8)",
		},
		"a sanitized tail, --tail-ok": {
			status: &bashtaskv1alpha1.StreamStatus{Tail: ptr.To("ab\uFFFDc"), TotalBytes: ptr.To[int64](4), Sanitized: ptr.To(true)},
			err:    cut(0), tailOK: true, wantOut: "ab\uFFFDc",
			wantNotes: "kubectl-bashtask: stdout: bytes 0 to 4 of 4 cannot be read (past the spill limit); the last 6 bytes kept in status follow, with U+FFFD in place of invalid UTF-8\n",
		},
		"a failure that is not about kept bytes": {
			status: finalStatus(stream, 4), got: stream[:3], err: errors.New("connection refused"), wantOut: stream[:3],
			wantErr: "reading stdout of task ns/t through output.bashtask.dev: connection refused",
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			var out, notes bytes.Buffer
			a := &app{errOut: &notes}
			final := &bashtaskv1alpha1.BashTask{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "t"}}
			final.Status.Stdout = tc.status
			res := readUpTo(&out, tc.got, tc.err)
			err := a.finishStream(streamTarget{name: "stdout", out: &out}, &res, final, tc.tailOK)
			if tc.wantErr == "" && err != nil || tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)) {
				t.Errorf("finishStream: %v, want an error containing %q", err, tc.wantErr)
			}
			if diff := cmp.Diff(tc.wantOut, out.String()); diff != "" {
				t.Errorf("output (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tc.wantNotes, notes.String()); diff != "" {
				t.Errorf("notes (-want +got):\n%s", diff)
			}
		})
	}
}

func TestOutputError(t *testing.T) {
	key := types.NamespacedName{Namespace: "ns", Name: "t"}
	status := func(code int32, details *metav1.StatusDetails) error {
		return &apierrors.StatusError{ErrStatus: metav1.Status{Status: metav1.StatusFailure, Code: code, Message: "refused", Details: details}}
	}
	tests := map[string]struct {
		err         error
		wantMsg     string
		wantDeleted bool
	}{
		"forbidden names the RBAC": {
			err:     status(http.StatusForbidden, nil),
			wantMsg: "reading stdout of task ns/t through output.bashtask.dev: refused (reading output takes get on bashtasks/log in the API group output.bashtask.dev)",
		},
		"a group nobody serves": {
			err:     status(http.StatusNotFound, nil),
			wantMsg: "refused (the cluster does not serve output.bashtask.dev/v1alpha1",
		},
		"a task that does not exist is only that": {
			err:     status(http.StatusNotFound, &metav1.StatusDetails{Name: "t", Kind: "bashtasks"}),
			wantMsg: "reading stdout of task ns/t through output.bashtask.dev: refused",
		},
		"a re-created task counts as deleted": {
			err: btclient.ErrTaskReplaced, wantDeleted: true,
			wantMsg: "reading stdout of task ns/t: the task was deleted while it was followed: the BashTask was re-created",
		},
		"a local write failure is only that": {
			err: &writeError{stream: "stdout", err: errors.New("broken pipe")}, wantMsg: "writing stdout: broken pipe",
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			err := outputError("stdout", key, tc.err)
			if !strings.Contains(err.Error(), tc.wantMsg) {
				t.Errorf("message %q, want it to contain %q", err.Error(), tc.wantMsg)
			}
			if got := errors.Is(err, errTaskDeleted); got != tc.wantDeleted {
				t.Errorf("errors.Is(err, errTaskDeleted) = %v, want %v", got, tc.wantDeleted)
			}
			if !errors.Is(err, tc.err) {
				t.Errorf("the cause is not wrapped")
			}
		})
	}
}

func TestGoneIsAStreamError(t *testing.T) {
	gone := &apierrors.StatusError{ErrStatus: metav1.Status{Code: http.StatusGone, Message: "stdout from offset 5 cannot be served"}}
	var se *btclient.StreamError
	if err := asStreamError(gone, 5); !errors.As(err, &se) || se.Offset != 5 || se.Message != "stdout from offset 5 cannot be served" {
		t.Errorf("asStreamError(410) = %v, want a StreamError at 5 with the message", err)
	}
	forbidden := &apierrors.StatusError{ErrStatus: metav1.Status{Code: http.StatusForbidden}}
	if err := asStreamError(forbidden, 0); !errors.Is(err, forbidden) || errors.As(err, &se) {
		t.Errorf("asStreamError(403) = %v, want it unchanged", err)
	}
}
