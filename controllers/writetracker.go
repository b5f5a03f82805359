package controllers

import (
	"sync"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/resourceversion"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// writeTracker remembers, per object, the resourceVersion this process's
// last successful write returned, until the informer cache shows that
// version. A pass that reads an older copy from the cache would act on
// state this process has already changed; the tracker lets Reconcile skip
// it and wait for the watch event of its own write.
//
// This happens on the hot path: the agent's FINISHED event for a short task
// usually arrives while the write-ahead's watch event is still on its way,
// and a pass on the older copy would try to dispatch the task again, which
// the API server refuses with a conflict (a wasted write).
//
// Versions are compared as Kubernetes defines it for one resource
// (k8s.io/apimachinery/pkg/util/resourceversion): decimal integers, larger
// is newer. A version that is not one (another storage backend) is never
// called stale.
type writeTracker struct {
	mu      sync.Mutex
	written map[types.NamespacedName]string
}

func newWriteTracker() *writeTracker {
	return &writeTracker{written: map[types.NamespacedName]string{}}
}

// wrote records the resourceVersion of obj as returned by a write.
func (w *writeTracker) wrote(obj client.Object) {
	if obj.GetResourceVersion() == "" {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.written[client.ObjectKeyFromObject(obj)] = obj.GetResourceVersion()
}

// stale reports whether cached, the resourceVersion of the cache's copy of
// key, is older than this process's last write of key. Once the cache has
// caught up the entry is dropped, so the map holds only writes in flight.
func (w *writeTracker) stale(key types.NamespacedName, cached string) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	last, ok := w.written[key]
	if !ok {
		return false
	}
	c, err := resourceversion.CompareResourceVersion(cached, last)
	if err != nil || c >= 0 {
		delete(w.written, key)
		return false
	}
	return true
}

// forget drops key, for an object that no longer exists.
func (w *writeTracker) forget(key types.NamespacedName) {
	w.mu.Lock()
	defer w.mu.Unlock()
	delete(w.written, key)
}
