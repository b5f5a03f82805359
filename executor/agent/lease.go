package agent

import (
	"fmt"
	"strconv"
	"strings"
)

// UIDRange is a closed range of user ids the agent leases to tasks at the
// tenant isolation level, one per live task; each task's GID is its UID.
type UIDRange struct {
	// First and Last are the lowest and highest UID of the range.
	First, Last uint32
}

// DefaultTaskUIDRange is the default of --task-uid-range: 65536 ids above
// the ranges of system users, regular users and the usual subordinate-id
// blocks of container runtimes (100000-165535).
var DefaultTaskUIDRange = UIDRange{First: 2000000, Last: 2065535}

// String returns "First-Last".
func (r UIDRange) String() string { return fmt.Sprintf("%d-%d", r.First, r.Last) }

// ParseUIDRange reads "FIRST-LAST" (inclusive). It returns an error for
// another form, a range whose First is above its Last, or one that
// includes 0 or 65534 (root and nobody) or the invalid id 4294967295.
func ParseUIDRange(s string) (UIDRange, error) {
	a, b, ok := strings.Cut(s, "-")
	first, err1 := strconv.ParseUint(a, 10, 32)
	last, err2 := strconv.ParseUint(b, 10, 32)
	if !ok || err1 != nil || err2 != nil {
		return UIDRange{}, fmt.Errorf("task UID range %q: want FIRST-LAST, numeric", s)
	}
	r := UIDRange{First: uint32(first), Last: uint32(last)}
	switch {
	case r.First > r.Last:
		return UIDRange{}, fmt.Errorf("task UID range %q: first above last", s)
	case r.First == 0 || (r.First <= 65534 && r.Last >= 65534) || r.Last == 1<<32-1:
		return UIDRange{}, fmt.Errorf("task UID range %q includes root, nobody or the invalid id", s)
	}
	return r, nil
}

// uidLeases hands out the UIDs of a range, at most one live task per UID.
// A UID is handed out round robin, so the one a task just returned is the
// last to be reused. Guarded by Server.mu.
type uidLeases struct {
	r    UIDRange
	next uint32
	held map[uint32]string // UID -> task UID holding it
}

func newUIDLeases(r UIDRange) *uidLeases {
	return &uidLeases{r: r, next: r.First, held: map[uint32]string{}}
}

// acquire leases a free UID to task; false when all are held.
func (l *uidLeases) acquire(task string) (uint32, bool) {
	size := uint64(l.r.Last-l.r.First) + 1
	for range size {
		uid := l.next
		if l.next == l.r.Last {
			l.next = l.r.First
		} else {
			l.next++
		}
		if _, taken := l.held[uid]; !taken {
			l.held[uid] = task
			return uid, true
		}
	}
	return 0, false
}

// full reports whether every UID of the range is held, when acquire would
// fail: Start refuses a task before it takes anything, so a refusal has no
// UID to give back.
func (l *uidLeases) full() bool {
	var n uint64
	for uid := range l.held {
		if uid >= l.r.First && uid <= l.r.Last {
			n++
		}
	}
	return n == uint64(l.r.Last-l.r.First)+1
}

// hold marks uid as held by task (a lease read back from the journal).
func (l *uidLeases) hold(uid uint32, task string) { l.held[uid] = task }

// release returns uid to the pool.
func (l *uidLeases) release(uid uint32) { delete(l.held, uid) }
