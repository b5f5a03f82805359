package outputapi

import (
	"context"
	"errors"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/grpc"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	agentv1 "github.com/bashtask/bashtask-operator/api/agent/v1"
	outputv1alpha1 "github.com/bashtask/bashtask-operator/api/output/v1alpha1"
	bashtaskv1alpha1 "github.com/bashtask/bashtask-operator/api/v1alpha1"
)

// taskStore is a client.Reader of one BashTask that counts its reads, so a
// test can tell a wait that polls from one that waits for an event.
type taskStore struct {
	mu    sync.Mutex
	task  *bashtaskv1alpha1.BashTask // nil: deleted
	reads atomic.Int64
}

func (s *taskStore) Get(_ context.Context, key client.ObjectKey, obj client.Object, _ ...client.GetOption) error {
	s.reads.Add(1)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.task == nil || s.task.Namespace != key.Namespace || s.task.Name != key.Name {
		return apierrors.NewNotFound(schema.GroupResource{Group: "bashtask.dev", Resource: "bashtasks"}, key.Name)
	}
	s.task.DeepCopyInto(obj.(*bashtaskv1alpha1.BashTask))
	return nil
}

func (s *taskStore) List(context.Context, client.ObjectList, ...client.ListOption) error {
	return errors.New("not implemented")
}

// set stores t (nil deletes) and returns a copy, as the cache would hand
// it to the informer's handlers.
func (s *taskStore) set(t *bashtaskv1alpha1.BashTask) *bashtaskv1alpha1.BashTask {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.task = t.DeepCopy()
	return t.DeepCopy()
}

// fakeInformer keeps the event handlers added to it; the test fires the
// events the cache's informer would.
type fakeInformer struct {
	cache.Informer // the methods the server does not call

	mu       sync.Mutex
	handlers map[*fakeRegistration]toolscache.ResourceEventHandler
}

type fakeRegistration struct {
	toolscache.ResourceEventHandlerRegistration
}

func (f *fakeInformer) AddEventHandler(h toolscache.ResourceEventHandler) (toolscache.ResourceEventHandlerRegistration, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.handlers == nil {
		f.handlers = map[*fakeRegistration]toolscache.ResourceEventHandler{}
	}
	r := &fakeRegistration{}
	f.handlers[r] = h
	return r, nil
}

func (f *fakeInformer) RemoveEventHandler(r toolscache.ResourceEventHandlerRegistration) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.handlers, r.(*fakeRegistration))
	return nil
}

func (f *fakeInformer) count() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.handlers)
}

func (f *fakeInformer) each(fn func(toolscache.ResourceEventHandler)) {
	f.mu.Lock()
	hs := make([]toolscache.ResourceEventHandler, 0, len(f.handlers))
	for _, h := range f.handlers {
		hs = append(hs, h)
	}
	f.mu.Unlock()
	for _, h := range hs {
		fn(h)
	}
}

func (f *fakeInformer) update(t *bashtaskv1alpha1.BashTask) {
	f.each(func(h toolscache.ResourceEventHandler) { h.OnUpdate(nil, t) })
}

// delete fires a deletion: obj is the task or the tombstone of a deletion
// the watch missed.
func (f *fakeInformer) delete(obj any) {
	f.each(func(h toolscache.ResourceEventHandler) { h.OnDelete(obj) })
}

type fakeInformers struct {
	inf  *fakeInformer
	gets atomic.Int64
}

func (f *fakeInformers) GetInformer(context.Context, client.Object, ...cache.InformerGetOption) (cache.Informer, error) {
	f.gets.Add(1)
	return f.inf, nil
}

func pendingTask() *bashtaskv1alpha1.BashTask {
	return &bashtaskv1alpha1.BashTask{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "t", UID: "uid-1"}}
}

func dispatchedCopy(t *bashtaskv1alpha1.BashTask, node string) *bashtaskv1alpha1.BashTask {
	d := t.DeepCopy()
	d.Status.NodeName = ptr.To(node)
	return d
}

func newTestServer(store *taskStore, infs Informers, agents Agents) *Server {
	return &Server{cfg: Config{Tasks: store, Informers: infs, Agents: agents}, dispatch: dispatchWaits{informers: infs}}
}

type waitResult struct {
	task *bashtaskv1alpha1.BashTask
	err  error
	at   time.Time
}

func startWait(ctx context.Context, s *Server, task *bashtaskv1alpha1.BashTask) <-chan waitResult {
	ch := make(chan waitResult, 1)
	go func() {
		t, err := s.waitDispatched(ctx, task)
		ch <- waitResult{t, err, time.Now()}
	}()
	return ch
}

// idleReads waits until the wait is in place, then returns how many reads
// of the task a further second of waiting costs: none when it waits for
// the informer, several when it polls.
func idleReads(t *testing.T, s *Server, store *taskStore, key types.NamespacedName) int64 {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		s.dispatch.mu.Lock()
		n := len(s.dispatch.waiters[key])
		s.dispatch.mu.Unlock()
		if n > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the wait did not register within 5s")
		}
		time.Sleep(5 * time.Millisecond)
	}
	time.Sleep(50 * time.Millisecond) // the read after the registration
	before := store.reads.Load()
	time.Sleep(time.Second)
	return store.reads.Load() - before
}

func awaitResult(t *testing.T, ch <-chan waitResult) waitResult {
	t.Helper()
	select {
	case r := <-ch:
		return r
	case <-time.After(5 * time.Second):
		t.Fatal("waitDispatched did not return within 5s of the event")
		return waitResult{}
	}
}

func checkNoWaiters(t *testing.T, s *Server) {
	t.Helper()
	s.dispatch.mu.Lock()
	defer s.dispatch.mu.Unlock()
	if len(s.dispatch.waiters) != 0 {
		t.Errorf("waiters left behind: %v", s.dispatch.waiters)
	}
}

// TestWaitDispatchedWakesOnDispatch: a wait costs no read while the task
// is pending and returns the dispatched task on the informer's update.
func TestWaitDispatchedWakesOnDispatch(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	store := &taskStore{}
	task := store.set(pendingTask())
	infs := &fakeInformers{inf: &fakeInformer{}}
	s := newTestServer(store, infs, nil)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	ch := startWait(ctx, s, task)
	if n := idleReads(t, s, store, client.ObjectKeyFromObject(task)); n != 0 {
		t.Errorf("a pending task was read %d times in 1s of waiting: the wait polls", n)
	}
	dispatchedAt := time.Now()
	infs.inf.update(store.set(dispatchedCopy(task, "node-a")))
	r := awaitResult(t, ch)
	if r.err != nil {
		t.Fatalf("waitDispatched: %v", r.err)
	}
	if got := ptr.Deref(r.task.Status.NodeName, ""); got != "node-a" {
		t.Errorf("the task returned has node %q, want node-a", got)
	}
	t.Logf("from the dispatch event to the wait's return: %v", r.at.Sub(dispatchedAt))
	checkNoWaiters(t, s)

	// A second wait shares the handler; stopping the server removes it.
	if _, err := s.waitDispatched(ctx, task); err != nil {
		t.Fatalf("waitDispatched of a dispatched task: %v", err)
	}
	if got := infs.inf.count(); got != 1 {
		t.Errorf("%d handlers on the informer after two waits, want 1", got)
	}
	s.dispatch.stop()
	if got := infs.inf.count(); got != 0 {
		t.Errorf("%d handlers on the informer after stop, want 0", got)
	}
}

// TestWaitDispatchedEnds: the wait ends with the task's end, its deletion,
// its replacement by a task of the same name, or the context's end.
func TestWaitDispatchedEnds(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	cause := errors.New("the client went away")
	for _, tc := range []struct {
		name    string
		event   func(inf *fakeInformer, store *taskStore, task *bashtaskv1alpha1.BashTask, cancel context.CancelCauseFunc)
		wantErr error
	}{{
		name: "finished without a node",
		event: func(inf *fakeInformer, store *taskStore, task *bashtaskv1alpha1.BashTask, _ context.CancelCauseFunc) {
			done := task.DeepCopy()
			done.Status.Reason = ptr.To(bashtaskv1alpha1.Reason("Cancelled"))
			inf.update(store.set(done))
		},
	}, {
		name: "deleted",
		event: func(inf *fakeInformer, store *taskStore, task *bashtaskv1alpha1.BashTask, _ context.CancelCauseFunc) {
			store.set(nil)
			inf.delete(toolscache.DeletedFinalStateUnknown{Key: "ns/t", Obj: task.DeepCopy()})
		},
		wantErr: errTaskGone,
	}, {
		name: "re-created",
		event: func(inf *fakeInformer, store *taskStore, task *bashtaskv1alpha1.BashTask, _ context.CancelCauseFunc) {
			other := dispatchedCopy(task, "node-b")
			other.UID = "uid-2"
			inf.update(store.set(other))
		},
		wantErr: errTaskGone,
	}, {
		name: "context ended",
		event: func(_ *fakeInformer, _ *taskStore, _ *bashtaskv1alpha1.BashTask, cancel context.CancelCauseFunc) {
			cancel(cause)
		},
		wantErr: cause,
	}} {
		t.Run(tc.name, func(t *testing.T) {
			store := &taskStore{}
			task := store.set(pendingTask())
			infs := &fakeInformers{inf: &fakeInformer{}}
			s := newTestServer(store, infs, nil)
			defer s.dispatch.stop()
			ctx, cancel := context.WithCancelCause(context.Background())
			defer cancel(nil)
			ch := startWait(ctx, s, task)
			idleReads(t, s, store, client.ObjectKeyFromObject(task))
			tc.event(infs.inf, store, task, cancel)
			r := awaitResult(t, ch)
			if !errors.Is(r.err, tc.wantErr) || (tc.wantErr == nil && r.err != nil) {
				t.Fatalf("waitDispatched: %v, want %v", r.err, tc.wantErr)
			}
			checkNoWaiters(t, s)
		})
	}
}

// TestWaitDispatchedWithoutInformer: with no informer the wait reads the
// task until it has a node.
func TestWaitDispatchedWithoutInformer(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	store := &taskStore{}
	task := store.set(pendingTask())
	s := newTestServer(store, nil, nil)
	ch := startWait(context.Background(), s, task)
	time.Sleep(3 * dispatchPollInterval)
	store.set(dispatchedCopy(task, "node-a"))
	r := awaitResult(t, ch)
	if r.err != nil || ptr.Deref(r.task.Status.NodeName, "") != "node-a" {
		t.Fatalf("waitDispatched: %v, %v", r.task, r.err)
	}
}

// fakeAgents serves one stream from every node's agent.
type fakeAgents struct {
	agentv1.ExecutorClient
	data []byte
}

func (f *fakeAgents) Client(context.Context, string) (agentv1.ExecutorClient, error) { return f, nil }

func (f *fakeAgents) ReadOutput(_ context.Context, in *agentv1.ReadOutputRequest, _ ...grpc.CallOption) (grpc.ServerStreamingClient[agentv1.OutputChunk], error) {
	total := int64(len(f.data))
	return &fakeOutput{chunks: []*agentv1.OutputChunk{
		{Header: &agentv1.OutputState{TotalBytes: total, Complete: true}},
		{Offset: in.GetOffset(), Data: f.data[in.GetOffset():]},
		{End: &agentv1.OutputState{TotalBytes: total, Complete: true}},
	}}, nil
}

type fakeOutput struct {
	grpc.ClientStream
	chunks []*agentv1.OutputChunk
}

func (f *fakeOutput) Recv() (*agentv1.OutputChunk, error) {
	if len(f.chunks) == 0 {
		return nil, errors.New("read past the end message")
	}
	c := f.chunks[0]
	f.chunks = f.chunks[1:]
	return c, nil
}

// firstByteWriter is a ResponseWriter that notes when the body's first
// byte is written.
type firstByteWriter struct {
	header http.Header
	mu     sync.Mutex
	body   []byte
	first  chan time.Time
}

func (w *firstByteWriter) Header() http.Header { return w.header }
func (w *firstByteWriter) WriteHeader(int)     {}
func (w *firstByteWriter) Flush()              {}
func (w *firstByteWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.body) == 0 && len(p) > 0 {
		w.first <- time.Now()
	}
	w.body = append(w.body, p...)
	return len(p), nil
}

// TestFollowOfPendingTaskStartsOnDispatch: a followed bashtasks/log of a
// task not dispatched yet sends its first byte as soon as the informer
// reports the dispatch, without reading the task meanwhile.
func TestFollowOfPendingTaskStartsOnDispatch(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	store := &taskStore{}
	task := store.set(pendingTask())
	infs := &fakeInformers{inf: &fakeInformer{}}
	s := newTestServer(store, infs, &fakeAgents{data: []byte("hello\n")})
	defer s.dispatch.stop()
	w := &firstByteWriter{header: http.Header{}, first: make(chan time.Time, 1)}
	lr := &logResponse{w: w, rc: http.NewResponseController(w)}
	o := outputv1alpha1.LogOptions{Stream: outputv1alpha1.StreamStdout, Follow: true}
	done := make(chan error, 1)
	go func() {
		done <- s.streamLog(context.Background(), lr, task, agentv1.OutputStream_OUTPUT_STREAM_STDOUT, o)
	}()
	if n := idleReads(t, s, store, client.ObjectKeyFromObject(task)); n != 0 {
		t.Errorf("the follow read the pending task %d times in 1s: it polls", n)
	}
	select {
	case <-w.first:
		t.Fatal("a byte was sent before the dispatch")
	default:
	}
	dispatchedAt := time.Now()
	infs.inf.update(store.set(dispatchedCopy(task, "node-a")))
	select {
	case at := <-w.first:
		t.Logf("from the dispatch event to the first byte: %v", at.Sub(dispatchedAt))
	case <-time.After(5 * time.Second):
		t.Fatal("no byte within 5s of the dispatch")
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("streamLog: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the follow did not end within 5s of the stream's end")
	}
	if got := string(w.body); got != "hello\n" {
		t.Errorf("body %q, want %q", got, "hello\n")
	}
	if got := w.header.Get(outputv1alpha1.HeaderTaskUID); got != string(task.UID) {
		t.Errorf("%s %q, want %q", outputv1alpha1.HeaderTaskUID, got, task.UID)
	}
	checkNoWaiters(t, s)
}

// TestStdinRequestBytesFitsOneAgentWrite: a bashtasks/stdin body the
// contract allows is one write to the agent.
func TestStdinRequestBytesFitsOneAgentWrite(t *testing.T) {
	if outputv1alpha1.StdinRequestBytes > agentv1.MaxStdinWriteBytes {
		t.Errorf("StdinRequestBytes %d exceeds the agent's MaxStdinWriteBytes %d", outputv1alpha1.StdinRequestBytes, agentv1.MaxStdinWriteBytes)
	}
}
