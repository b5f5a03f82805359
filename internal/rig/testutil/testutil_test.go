package testutil

import (
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"
)

// recorder is a testing.TB whose Fatalf and Skip end the calling goroutine
// (as the real ones do) and keep what they were told.
type recorder struct {
	testing.TB
	fatal, skip string
}

func (r *recorder) Helper() {}
func (r *recorder) Fatalf(format string, args ...any) {
	r.fatal = fmt.Sprintf(format, args...)
	runtime.Goexit()
}
func (r *recorder) Skip(args ...any) {
	r.skip = fmt.Sprint(args...)
	runtime.Goexit()
}

// run calls f with a recorder on a goroutine of its own, so that Goexit
// ends only f.
func run(t *testing.T, f func(tb testing.TB)) *recorder {
	r := &recorder{TB: t}
	done := make(chan struct{})
	go func() { defer close(done); f(r) }()
	<-done
	return r
}

func TestWaitForNamesWhatAndLastState(t *testing.T) {
	n := 0
	r := run(t, func(tb testing.TB) {
		WaitFor(tb, "the answer", 120*time.Millisecond, func() error { n++; return fmt.Errorf("saw %d", n) })
	})
	if !strings.Contains(r.fatal, "waiting for the answer") || !strings.Contains(r.fatal, fmt.Sprintf("saw %d", n)) {
		t.Errorf("failure %q, want what was awaited and the last state (saw %d)", r.fatal, n)
	}
	r = run(t, func(tb testing.TB) {
		k := 0
		WaitFor(tb, "three polls", time.Minute, Check(func() bool { k++; return k == 3 }, nil))
	})
	if r.fatal != "" {
		t.Errorf("a condition that holds failed: %s", r.fatal)
	}
	if err := Check(func() bool { return false }, func() string { return "state" })(); err == nil || err.Error() != "state" {
		t.Errorf("Check's error %v, want the state", err)
	}
	if err := Check(func() bool { return false }, nil)(); err == nil {
		t.Errorf("Check without a state: %v", err)
	}
}

func TestSkipUnlessStrict(t *testing.T) {
	t.Setenv(StrictEnv, "")
	r := run(t, func(tb testing.TB) { SkipUnlessStrictf(tb, "no %s here", "Landlock") })
	if r.skip != "no Landlock here" || r.fatal != "" {
		t.Errorf("not strict: skip %q, fatal %q; want a skip", r.skip, r.fatal)
	}
	t.Setenv(StrictEnv, "1")
	r = run(t, func(tb testing.TB) { SkipUnlessStrict(tb, "no Landlock here") })
	if r.skip != "" || !strings.Contains(r.fatal, "no Landlock here") || !strings.Contains(r.fatal, StrictEnv) {
		t.Errorf("strict: skip %q, fatal %q; want a failure naming the reason and %s", r.skip, r.fatal, StrictEnv)
	}
}
