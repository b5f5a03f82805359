package localcluster

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	s3types "github.com/aws/aws-sdk-go-v2/service/s3/types"
	"github.com/aws/smithy-go"
)

// A failed step is named in the error and every step that ran, the failed
// one included, is undone in reverse order; an undo's error names its step
// too, and the undo goes on past it.
func TestStepsUndoInReverse(t *testing.T) {
	dir := t.TempDir()
	r := &steps{log: slog.New(slog.DiscardHandler), dir: dir}
	var undone []string
	step := func(name string, fail, undoFails bool) Step {
		return Step{Name: name,
			Do: func(context.Context) error {
				r.record("", "setting", name+" on", 0)
				if fail {
					return errors.New("boom")
				}
				return nil
			},
			Undo: func() error {
				undone = append(undone, name)
				if undoFails {
					return errors.New("stuck")
				}
				return nil
			}}
	}
	ctx := context.Background()
	for _, s := range []Step{step("a", false, false), step("b", false, true), {Name: "c", Do: func(context.Context) error { return nil }}} {
		if err := r.run(ctx, s); err != nil {
			t.Fatalf("step %s: %v", s.Name, err)
		}
	}
	err := r.run(ctx, step("d", true, false))
	var se *StepError
	if !errors.As(err, &se) || se.Step != "d" || se.Undo || !strings.Contains(err.Error(), `step "d"`) {
		t.Fatalf("failed step's error %v (%T), want a *StepError naming d", err, err)
	}
	if got := r.names(); !slices.Equal(got, []string{"a", "b", "c", "d"}) {
		t.Errorf("steps that ran %v, want a b c d", got)
	}
	uerr := r.undo()
	if want := []string{"d", "b", "a"}; !slices.Equal(undone, want) {
		t.Errorf("undone %v, want %v (reverse, the failed step included, c has no undo)", undone, want)
	}
	if !errors.As(uerr, &se) || se.Step != "b" || !se.Undo {
		t.Errorf("undo error %v, want a *StepError of b's undo", uerr)
	}
	if r.undo() != nil || len(undone) != 3 {
		t.Errorf("a second undo ran steps again: %v", undone)
	}
	if len(r.changes) != 3 || r.changes[1].Step != "b" || r.changes[1].Kind != "setting" {
		t.Errorf("changes %+v, want one setting per Do of a, b and d, named by its step", r.changes)
	}
	logged, err := os.ReadFile(filepath.Join(dir, "changes.log"))
	if err != nil || strings.Count(string(logged), "\n") != 3 || !strings.Contains(string(logged), "d setting: d on") {
		t.Errorf("changes.log %q (%v), want the three changes", logged, err)
	}
}

// A cancelled context stops the start-up before the next step.
func TestStepsStopOnCancel(t *testing.T) {
	r := &steps{log: slog.New(slog.DiscardHandler)}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	ran := false
	err := r.run(ctx, Step{Name: "late", Do: func(context.Context) error { ran = true; return nil }})
	if ran || !errors.Is(err, context.Canceled) {
		t.Errorf("ran %v, error %v; want the step skipped with context.Canceled", ran, err)
	}
}

// BucketExists goes by the error's type or S3 code, wrapped or not.
func TestBucketExists(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{&s3types.BucketAlreadyOwnedByYou{}, true},
		{fmt.Errorf("create: %w", &s3types.BucketAlreadyExists{}), true},
		{&smithy.GenericAPIError{Code: "BucketAlreadyOwnedByYou"}, true},
		{&smithy.GenericAPIError{Code: "AccessDenied", Message: "BucketAlreadyExists"}, false},
		{errors.New("BucketAlreadyExists"), false},
		{nil, false},
	} {
		if got := BucketExists(tc.err); got != tc.want {
			t.Errorf("BucketExists(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
}
