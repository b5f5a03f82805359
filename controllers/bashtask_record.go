package controllers

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	bashtaskv1alpha1 "github.com/bashtask/bashtask-operator/api/v1alpha1"
)

// TaskRecords keeps the records of finished tasks (internal/taskrecord
// over the output bucket).
type TaskRecords interface {
	// Write stores bt's record; an error when the bucket refuses it.
	Write(ctx context.Context, bt *bashtaskv1alpha1.BashTask) error
}

// ReasonRecordNotKept is the reason of the Warning event of a deleted
// task whose record could not be written within RecordGiveUpAfter.
const ReasonRecordNotKept = "RecordNotKept"

// RecordGiveUpAfter is how long after a finished task's deletion the
// controller keeps retrying its record before it removes the finalizer
// without one: a bucket that stays unreachable must not hold deletions
// (and namespace deletions) forever.
const RecordGiveUpAfter = 5 * time.Minute

// keepRecord writes the record of a deleted finished task that was
// dispatched (one never dispatched has no output) before its finalizer
// is removed. An error before RecordGiveUpAfter retries the pass; after
// it, a Warning event says the output is no longer readable by name.
func (r *BashTaskReconciler) keepRecord(ctx context.Context, bt *bashtaskv1alpha1.BashTask) error {
	if r.opts.Records == nil || !isDispatched(bt) || !controllerutil.ContainsFinalizer(bt, Finalizer) {
		return nil
	}
	err := r.opts.Records.Write(ctx, bt)
	if err == nil {
		return nil
	}
	if bt.DeletionTimestamp != nil && r.clock.Since(bt.DeletionTimestamp.Time) < RecordGiveUpAfter {
		return fmt.Errorf("keeping the record of %s: %w", klog.KObj(bt), err)
	}
	ctrl.LoggerFrom(ctx).Error(err, "Removing the finalizer without the task's record")
	r.recorder.Eventf(bt, nil, corev1.EventTypeWarning, ReasonRecordNotKept, "Delete",
		"the task's record could not be written to the output bucket within %s: its output cannot be read once it is gone: %v", RecordGiveUpAfter, err)
	return nil
}
