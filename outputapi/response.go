package outputapi

import (
	"net/http"
	"strconv"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	outputv1alpha1 "github.com/bashtask/bashtask-operator/api/output/v1alpha1"
)

// logResponse is one response in progress: the headers are written once,
// before the first byte, with the state known at the start.
type logResponse struct {
	w       http.ResponseWriter
	rc      *http.ResponseController
	started bool
	offset  int64 // of the next byte to write
	sent    int64
	limit   int64
}

func (lr *logResponse) start(uid types.UID, offset, total int64, complete bool) {
	h := lr.w.Header()
	h.Set("Content-Type", "application/octet-stream")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Cache-Control", "no-store")
	h.Set(outputv1alpha1.HeaderOffset, strconv.FormatInt(offset, 10))
	h.Set(outputv1alpha1.HeaderTotal, strconv.FormatInt(total, 10))
	h.Set(outputv1alpha1.HeaderComplete, strconv.FormatBool(complete))
	h.Set(outputv1alpha1.HeaderTaskUID, string(uid))
	h.Set("Trailer", outputv1alpha1.TrailerEndOffset+", "+outputv1alpha1.TrailerError)
	lr.w.WriteHeader(http.StatusOK)
	_ = lr.rc.Flush()
	lr.started = true
}

// write sends bytes at lr.offset and flushes them: a follower sees each
// chunk as the agent sends it.
func (lr *logResponse) write(p []byte) error {
	if _, err := lr.w.Write(p); err != nil {
		return err
	}
	lr.offset += int64(len(p))
	lr.sent += int64(len(p))
	return lr.rc.Flush()
}

// fail ends a started response with the trailers naming where and why.
func (lr *logResponse) fail(msg string) {
	lr.w.Header().Set(outputv1alpha1.TrailerEndOffset, strconv.FormatInt(lr.offset, 10))
	lr.w.Header().Set(outputv1alpha1.TrailerError, msg)
}

func (lr *logResponse) remaining() int64 {
	if lr.limit <= 0 {
		return 0
	}
	return max(lr.limit-lr.sent, 0)
}

func (lr *logResponse) done() bool { return lr.limit > 0 && lr.sent >= lr.limit }

func rangeNotSatisfiable(msg string) error {
	return &apierrors.StatusError{ErrStatus: metav1.Status{
		Status: metav1.StatusFailure, Code: http.StatusRequestedRangeNotSatisfiable,
		Reason: "RequestedRangeNotSatisfiable", Message: msg,
	}}
}

// goneError is a 410 Gone Status with reason Gone: bytes of the stream
// that are no longer kept anywhere. apierrors.NewGone is deprecated in
// favour of NewResourceExpired, whose reason (Expired) speaks of a watch's
// resourceVersion, not of a stream's bytes.
func goneError(msg string) *apierrors.StatusError {
	return &apierrors.StatusError{ErrStatus: metav1.Status{
		Status:  metav1.StatusFailure,
		Code:    http.StatusGone,
		Reason:  metav1.StatusReasonGone,
		Message: msg,
	}}
}
