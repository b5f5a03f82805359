package agent

import (
	"context"
	"slices"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	agentv1 "github.com/bashtask/bashtask-operator/api/agent/v1"
)

// Cancel implements the Cancel RPC.
func (s *Server) Cancel(ctx context.Context, req *agentv1.CancelRequest) (*agentv1.CancelResponse, error) {
	release, err := s.admitFence(ctx, "Cancel", req.GetFence())
	if err != nil {
		return nil, err
	}
	defer release()
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.tasks[req.GetUid()]
	if !ok {
		return nil, status.Errorf(codes.NotFound, "task %s is not known", req.GetUid())
	}
	switch {
	case e.starting():
		e.cancelled = true // Start cancels the task once it exists
	case e.task != nil && e.status.State == agentv1.TaskState_TASK_STATE_RUNNING:
		e.cancelled = true
		e.task.Cancel() // idempotent; no effect once the shell exited
	}
	return &agentv1.CancelResponse{Status: clone(e.status)}, nil
}

// Get implements the Get RPC.
func (s *Server) Get(_ context.Context, req *agentv1.GetRequest) (*agentv1.GetResponse, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.tasks[req.GetUid()]
	if !ok {
		return nil, status.Errorf(codes.NotFound, "task %s is not known", req.GetUid())
	}
	s.refreshLocked(e)
	return &agentv1.GetResponse{Status: clone(e.status)}, nil
}

// Page bounds of the List RPC.
const (
	// DefaultListPageSize is the page size of a List request that names
	// none.
	DefaultListPageSize = 100
	// MaxListPageSize is the largest page size a List request gets.
	MaxListPageSize = 1000
	// MaxListPageBytes bounds the encoded statuses of one List page (but
	// for a page of a single task): 1 MiB, a quarter of gRPC's default
	// 4 MiB receive limit, whatever the number of tasks and their tails.
	MaxListPageBytes = 1 << 20
)

// List implements the List RPC: one page of the tasks, sorted by UID,
// starting after the page token (the last UID of the previous page).
func (s *Server) List(_ context.Context, req *agentv1.ListRequest) (*agentv1.ListResponse, error) {
	size := int(req.GetPageSize())
	switch {
	case size < 0:
		return nil, status.Errorf(codes.InvalidArgument, "page_size %d is negative", size)
	case size == 0:
		size = DefaultListPageSize
	case size > MaxListPageSize:
		size = MaxListPageSize
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	uids := s.sortedUIDsLocked()
	start, _ := slices.BinarySearch(uids, req.GetPageToken())
	if tok := req.GetPageToken(); tok != "" && start < len(uids) && uids[start] == tok {
		start++
	}
	resp := &agentv1.ListResponse{}
	bytes := 0
	for i := start; i < len(uids); i++ {
		e := s.tasks[uids[i]]
		s.refreshLocked(e)
		st := clone(e.status)
		n := proto.Size(st)
		if len(resp.Tasks) == size || (len(resp.Tasks) > 0 && bytes+n > MaxListPageBytes) {
			resp.NextPageToken = uids[i-1]
			break
		}
		resp.Tasks = append(resp.Tasks, st)
		bytes += n
	}
	return resp, nil
}

func (s *Server) sortedUIDsLocked() []string {
	uids := make([]string, 0, len(s.tasks))
	for uid := range s.tasks {
		uids = append(uids, uid)
	}
	slices.Sort(uids)
	return uids
}

// refreshLocked brings a running task's output into its status.
func (s *Server) refreshLocked(e *entry) {
	if e.task != nil && e.status.State == agentv1.TaskState_TASK_STATE_RUNNING {
		applySnapshot(e.status, e.task.Snapshot())
		e.setKeptLocked()
	}
}
