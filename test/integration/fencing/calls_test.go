package fencing_test

import (
	"context"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/status"

	agentv1 "github.com/bashtask/bashtask-operator/api/agent/v1"
)

// call is one Start, Cancel or Watch an agent served: when it arrived, the
// fence it carried and how the agent answered (a Watch counts as accepted
// once the agent sent its first message).
type call struct {
	at           time.Time
	rpc          string
	fence        *agentv1.Fence
	accepted     bool
	message      string
	uid          string
	alreadyKnown bool
}

// callLog collects the calls of every agent.
type callLog struct {
	mu    sync.Mutex
	calls []call
}

func (l *callLog) add(c call) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.calls = append(l.calls, c)
}

// all returns a copy of the calls so far.
func (l *callLog) all() []call {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]call(nil), l.calls...)
}

func (l *callLog) unary(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	c := call{at: time.Now()}
	switch r := req.(type) {
	case *agentv1.StartRequest:
		c.rpc, c.fence, c.uid = "Start", r.GetFence(), r.GetSpec().GetRef().GetUid()
	case *agentv1.CancelRequest:
		c.rpc, c.fence, c.uid = "Cancel", r.GetFence(), r.GetUid()
	default:
		return handler(ctx, req)
	}
	resp, err := handler(ctx, req)
	c.accepted, c.message = err == nil, status.Convert(err).Message()
	if s, ok := resp.(*agentv1.StartResponse); ok {
		c.alreadyKnown = s.GetAlreadyKnown()
	}
	l.add(c)
	return resp, err
}

func (l *callLog) stream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	w := &watchStream{ServerStream: ss, log: l, c: call{at: time.Now(), rpc: "Watch"}}
	err := handler(srv, w)
	if !w.recorded {
		w.c.message = status.Convert(err).Message()
		l.add(w.c)
	}
	return err
}

// watchStream records a Watch: its fence from the request, and its
// acceptance at the first message the agent sends.
type watchStream struct {
	grpc.ServerStream
	log      *callLog
	c        call
	recorded bool
}

func (w *watchStream) RecvMsg(m any) error {
	err := w.ServerStream.RecvMsg(m)
	if r, ok := m.(*agentv1.WatchRequest); ok && err == nil {
		w.c.fence = r.GetFence()
	}
	return err
}

func (w *watchStream) SendMsg(m any) error {
	err := w.ServerStream.SendMsg(m)
	if !w.recorded && err == nil {
		w.recorded, w.c.accepted = true, true
		w.log.add(w.c)
	}
	return err
}
