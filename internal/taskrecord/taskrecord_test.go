package taskrecord_test

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"gocloud.dev/blob"
	_ "gocloud.dev/blob/fileblob"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	bashtaskv1alpha1 "github.com/bashtask/bashtask-operator/api/v1alpha1"
	"github.com/bashtask/bashtask-operator/internal/taskrecord"
)

func openBucket(t *testing.T) (*blob.Bucket, string) {
	t.Helper()
	dir := t.TempDir()
	b, err := blob.OpenBucket(t.Context(), "file://"+dir+"?no_tmp_dir=true")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close() })
	return b, dir
}

func finished(name, uid, stdin string) *bashtaskv1alpha1.BashTask {
	return &bashtaskv1alpha1.BashTask{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, UID: types.UID("u" + uid)},
		Spec:       bashtaskv1alpha1.BashTaskSpec{Command: "echo", Stdin: ptr.To(stdin)},
		Status:     bashtaskv1alpha1.BashTaskStatus{Reason: ptr.To(bashtaskv1alpha1.ReasonSucceeded), NodeName: ptr.To("n1")},
	}
}

// TestRecords: a record is written beside the task's streams, read back
// by UID without the spec, found by name as the one written last, and
// its absence is ErrNotFound; a stream object under the same prefix is
// not taken for a record.
func TestRecords(t *testing.T) {
	b, dir := openBucket(t)
	ctx := t.Context()
	first, second := finished("a", "1", "secret input"), finished("a", "2", "")
	if err := os.MkdirAll(filepath.Join(dir, "ns", "a", "u1"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "ns", "a", "u1", "stdout"), []byte("out"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := taskrecord.Write(ctx, b, first); err != nil {
		t.Fatal(err)
	}
	time.Sleep(20 * time.Millisecond) // distinct modification times
	if err := taskrecord.Write(ctx, b, second); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, taskrecord.Key("ns", "a", "u1"))); err != nil {
		t.Fatalf("the record's key: %v", err)
	}
	got, err := taskrecord.Read(ctx, b, "ns", "a", "u1")
	if err != nil {
		t.Fatal(err)
	}
	if got.UID != "u1" || ptr.Deref(got.Status.Reason, "") != bashtaskv1alpha1.ReasonSucceeded || got.Spec.Stdin != nil {
		t.Errorf("record of u1: uid %s, reason %v, stdin %v", got.UID, got.Status.Reason, got.Spec.Stdin)
	}
	newest, err := taskrecord.Newest(ctx, b, "ns", "a")
	if err != nil || newest.UID != "u2" {
		t.Fatalf("newest of ns/a: %v, %v; want u2", newest, err)
	}
	if _, err := taskrecord.Newest(ctx, b, "ns", "b"); !errors.Is(err, taskrecord.ErrNotFound) {
		t.Errorf("newest of a name without records: %v, want ErrNotFound", err)
	}
	if _, err := taskrecord.Read(ctx, b, "ns", "a", "u3"); !errors.Is(err, taskrecord.ErrNotFound) {
		t.Errorf("a UID without a record: %v, want ErrNotFound", err)
	}
}
