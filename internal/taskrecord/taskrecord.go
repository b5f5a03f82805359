// Package taskrecord keeps a finished BashTask's record in the output
// bucket, beside its streams, so that the output API can still serve the
// task's output once the object is deleted (docs/output.md, "After the
// task is deleted"). The controller writes the record just before it lets
// a finished task go; the output API reads it when the task is not found.
package taskrecord

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"gocloud.dev/blob"
	"gocloud.dev/gcerrors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	bashtaskv1alpha1 "github.com/bashtask/bashtask-operator/api/v1alpha1"
	"github.com/bashtask/bashtask-operator/internal/outputkey"
)

// Name is the last element of a record's key: <namespace>/<name>/<uid>/task.json,
// beside the task's stream objects (outputkey.Object), so that one prefix
// and one lifecycle rule hold everything kept of a task.
const Name = "task.json"

// MaxBytes is the largest record Read accepts, in bytes: a record is a
// task's metadata and status, which the controller's status budget keeps
// far below it.
const MaxBytes = 4 << 20

// ErrNotFound is returned (wrapped) when the bucket holds no record of the
// task asked for.
var ErrNotFound = errors.New("no record of the task in the output bucket")

// Key is the key of the record of the task with this namespace, name and UID.
func Key(namespace, name string, uid types.UID) string {
	return outputkey.Object(namespace, name, string(uid), Name)
}

// Of returns the record of bt: its identity (name, namespace, UID,
// generation, creation and deletion times, labels) and its status. The
// spec is left out: the output API reads none of it for a finished task,
// and spec.stdin may hold data its author meant for the command only.
func Of(bt *bashtaskv1alpha1.BashTask) *bashtaskv1alpha1.BashTask {
	return &bashtaskv1alpha1.BashTask{
		TypeMeta: metav1.TypeMeta{APIVersion: bashtaskv1alpha1.GroupVersion.String(), Kind: "BashTask"},
		ObjectMeta: metav1.ObjectMeta{
			Name: bt.Name, Namespace: bt.Namespace, UID: bt.UID, Generation: bt.Generation,
			CreationTimestamp: bt.CreationTimestamp, DeletionTimestamp: bt.DeletionTimestamp,
			Labels: bt.Labels,
		},
		Status: *bt.Status.DeepCopy(),
	}
}

// Write stores the record of bt in b under Key. It returns the bucket's
// error, wrapped with the key.
func Write(ctx context.Context, b *blob.Bucket, bt *bashtaskv1alpha1.BashTask) error {
	data, err := json.Marshal(Of(bt))
	if err != nil {
		return fmt.Errorf("encoding the record of %s/%s: %w", bt.Namespace, bt.Name, err)
	}
	key := Key(bt.Namespace, bt.Name, bt.UID)
	if err := b.WriteAll(ctx, key, data, &blob.WriterOptions{ContentType: "application/json"}); err != nil {
		return fmt.Errorf("writing %s: %w", key, err)
	}
	return nil
}

// Read returns the record of the task namespace/name with this UID: an
// error wrapping ErrNotFound when there is none, else the bucket's or the
// decoder's error.
func Read(ctx context.Context, b *blob.Bucket, namespace, name string, uid types.UID) (*bashtaskv1alpha1.BashTask, error) {
	key := Key(namespace, name, uid)
	r, err := b.NewReader(ctx, key, nil)
	if err != nil {
		if gcerrors.Code(err) == gcerrors.NotFound {
			return nil, fmt.Errorf("%s: %w", key, ErrNotFound)
		}
		return nil, fmt.Errorf("reading %s: %w", key, err)
	}
	defer r.Close()
	data, err := io.ReadAll(io.LimitReader(r, MaxBytes+1))
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", key, err)
	}
	if len(data) > MaxBytes {
		return nil, fmt.Errorf("reading %s: larger than %d bytes", key, MaxBytes)
	}
	var bt bashtaskv1alpha1.BashTask
	if err := json.Unmarshal(data, &bt); err != nil {
		return nil, fmt.Errorf("decoding %s: %w", key, err)
	}
	if bt.Namespace != namespace || bt.Name != name || bt.UID != uid {
		return nil, fmt.Errorf("%s holds the record of %s/%s (uid %s)", key, bt.Namespace, bt.Name, bt.UID)
	}
	return &bt, nil
}

// Newest returns the record of the task namespace/name written last: of
// the tasks that had the name, the one deleted last. It returns an error
// wrapping ErrNotFound when the bucket holds no record under the name,
// else the bucket's error.
func Newest(ctx context.Context, b *blob.Bucket, namespace, name string) (*bashtaskv1alpha1.BashTask, error) {
	prefix := namespace + "/" + name + "/"
	it := b.List(&blob.ListOptions{Prefix: prefix})
	var newest string
	var at time.Time
	for {
		obj, err := it.Next(ctx)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("listing %s: %w", prefix, err)
		}
		uid, ok := strings.CutSuffix(strings.TrimPrefix(obj.Key, prefix), "/"+Name)
		if !ok || uid == "" || strings.Contains(uid, "/") {
			continue // a stream, a part, or another name's record
		}
		if newest == "" || obj.ModTime.After(at) {
			newest, at = uid, obj.ModTime
		}
	}
	if newest == "" {
		return nil, fmt.Errorf("%s*/%s: %w", prefix, Name, ErrNotFound)
	}
	return Read(ctx, b, namespace, name, types.UID(newest))
}
