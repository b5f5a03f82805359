// Package testutil holds the helpers every test package of the project
// shares: one way to wait for a condition, one way to wait for BashTasks
// to end, and one way to skip a test the host cannot run. One copy each,
// so a timeout message, a polling interval or the strict mode of CI is
// decided once instead of in every package.
package testutil

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sort"
	"strings"
	"testing"
	"time"

	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/bashtask/bashtask-operator/api/v1alpha1"
)

// PollInterval is how often WaitFor checks its condition: short enough
// that a test does not wait long past the moment the condition holds,
// long enough not to load an API server that the other tests share.
const PollInterval = 50 * time.Millisecond

// WaitFor polls cond every PollInterval until it returns nil, and fails
// the test with t.Fatalf after timeout. cond's error is the last observed
// state: the failure names what was awaited (what) and that state, which
// is what one reads first when a wait times out.
func WaitFor(t testing.TB, what string, timeout time.Duration, cond func() error) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		err := cond()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("waiting for %s: not within %s; last observed: %v", what, timeout, err)
		}
		time.Sleep(PollInterval)
	}
}

// Check turns a boolean condition into one for WaitFor: state describes
// what was observed when ok returned false (called only then).
func Check(ok func() bool, state func() string) func() error {
	return func() error {
		if ok() {
			return nil
		}
		if state == nil {
			return errors.New("condition false")
		}
		return errors.New(state())
	}
}

// WaitTerminal waits until every named BashTask of namespace ns has a
// terminal reason (status.reason set) and returns them by name. On
// timeout the failure lists the tasks still running with their phase,
// node and conditions.
func WaitTerminal(t testing.TB, c client.Reader, ns string, names []string, timeout time.Duration) map[string]*v1.BashTask {
	t.Helper()
	got := map[string]*v1.BashTask{}
	WaitFor(t, fmt.Sprintf("%d tasks of %s to be terminal", len(names), ns), timeout, func() error {
		var list v1.BashTaskList
		if err := c.List(context.Background(), &list, client.InNamespace(ns)); err != nil {
			return fmt.Errorf("listing the tasks: %w", err)
		}
		for i := range list.Items {
			if bt := &list.Items[i]; ptr.Deref(bt.Status.Reason, "") != "" {
				got[bt.Name] = bt
			}
		}
		var missing []string
		for _, n := range names {
			if got[n] == nil {
				missing = append(missing, n)
			}
		}
		if len(missing) == 0 {
			return nil
		}
		sort.Strings(missing)
		var unfinished []string
		for i := range list.Items {
			if bt := &list.Items[i]; ptr.Deref(bt.Status.Reason, "") == "" {
				unfinished = append(unfinished, fmt.Sprintf("%s (uid %s phase %q node %q agent %+v conditions %+v finalizers %v)", bt.Name, bt.UID,
					ptr.Deref(bt.Status.Phase, ""), ptr.Deref(bt.Status.NodeName, ""), bt.Status.Agent, bt.Status.Conditions, bt.Finalizers))
			}
		}
		return fmt.Errorf("%d of %d not terminal: %s; unfinished: %s", len(missing), len(names),
			strings.Join(missing, " "), strings.Join(unfinished, "; "))
	})
	return got
}

// StrictEnv is the environment variable that makes SkipUnlessStrict fail
// instead of skip; .ci/run sets it to 1.
const StrictEnv = "BASHTASK_STRICT"

// Strict reports whether StrictEnv is 1.
func Strict() bool { return os.Getenv(StrictEnv) == "1" }

// SkipUnlessStrict skips the test with reason, as t.Skip does, except
// when BASHTASK_STRICT=1: then it fails the test. Tests skip the
// isolation cases a weak kernel cannot run (no Landlock, no cgroup v2, no
// cgroup namespace) so that a laptop still runs the rest; in CI, whose
// machine has all of them, such a skip would hide a regression that
// turns the feature off, so there it is an error.
func SkipUnlessStrict(t testing.TB, reason string) {
	t.Helper()
	if Strict() {
		t.Fatalf("%s=1, so this is not skipped: %s", StrictEnv, reason)
	}
	t.Skip(reason)
}

// SkipUnlessStrictf is SkipUnlessStrict with a format.
func SkipUnlessStrictf(t testing.TB, format string, args ...any) {
	t.Helper()
	SkipUnlessStrict(t, fmt.Sprintf(format, args...))
}
