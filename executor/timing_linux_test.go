package executor

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

// subSecondBound is how long a task with a 100 ms timeout and a 200 ms
// grace period may take from Start to its Result: the 300 ms it asks
// for plus the start of bash and the stop's polling, with room for a
// busy machine; whole-second rounding anywhere would take it past.
const subSecondBound = 900 * time.Millisecond

// A timeout and a grace period under a second are honoured as asked: a
// command that ignores SIGTERM, with a 100 ms timeout and a 200 ms grace,
// is SIGKILLed after both and ends TimedOut well under a second, and the
// message gives the real timeout. Without a grace period
// (KillGraceNone) SIGKILL follows at once.
func TestSubSecondTimeoutAndGrace(t *testing.T) {
	t.Parallel()
	tests := map[string]struct {
		grace   time.Duration
		atLeast time.Duration
	}{
		"200ms grace": {grace: 200 * time.Millisecond, atLeast: 300 * time.Millisecond},
		"no grace":    {grace: KillGraceNone, atLeast: 100 * time.Millisecond},
	}
	forEachMechanism(t, func(t *testing.T, ex *Executor) {
		for name, tc := range tests {
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				m := marker(30)
				spec := testSpec(t, fmt.Sprintf("trap '' TERM; echo armed; sleep %s", m))
				spec.Timeout, spec.KillGrace = 100*time.Millisecond, tc.grace
				begin := time.Now()
				res := run(t, ex, spec)
				took := time.Since(begin)
				t.Logf("ended %v after Start (timeout %v, grace %v)", took, spec.Timeout, tc.grace)
				if took < tc.atLeast || took > subSecondBound {
					t.Errorf("ended %v after Start, want between %v (timeout and grace) and %v", took, tc.atLeast, subSecondBound)
				}
				if res.Reason != ReasonTimedOut || res.Signal != "SIGKILL" {
					t.Errorf("reason %s, signal %q; want TimedOut, SIGKILL (TERM is ignored)", res.Reason, res.Signal)
				}
				if !strings.Contains(res.Message, "timed out after 100ms") {
					t.Errorf("message %q does not give the real timeout, 100ms", res.Message)
				}
				if alive := withArg(m); len(alive) > 0 {
					t.Errorf("processes %v still alive", alive)
				}
			})
		}
	})
}
