package controllers

import (
	"encoding/json"
	"fmt"
	"unicode/utf8"

	bashtaskv1alpha1 "github.com/bashtask/bashtask-operator/api/v1alpha1"
)

// DefaultStatusBudgetBytes is the default --status-budget-bytes: the largest
// JSON encoding of a BashTask's status the controller writes (256 KiB). It
// keeps a task far below etcd's request limit (1.5 MiB by default) whatever
// the command printed.
const DefaultStatusBudgetBytes = 262144

// FitStatusBudget shortens the stdout and stderr tails of st from the front,
// at UTF-8 rune boundaries, until the JSON encoding of st is at most budget
// bytes. The longer tail is shortened first. A shortened stream is marked
// truncated. The size is measured on the encoding, not the raw bytes: a
// control byte such as \x01 becomes the six bytes \u0001, so binary output
// grows up to six-fold when escaped.
//
// It returns an error when the status is over budget even with both tails
// empty; callers treat that as a bug in the budget's configuration, since
// every other status field is bounded by the schema.
func FitStatusBudget(st *bashtaskv1alpha1.BashTaskStatus, budget int) error {
	for {
		raw, err := json.Marshal(st)
		if err != nil {
			return fmt.Errorf("encoding status to measure it: %w", err)
		}
		excess := len(raw) - budget
		if excess <= 0 {
			return nil
		}
		s := longerTail(st.Stdout, st.Stderr)
		if s == nil {
			return fmt.Errorf("status encodes to %d bytes without any output tail, over the budget of %d bytes", len(raw), budget)
		}
		s.Tail = s.Tail[cutIndex(s.Tail, excess):]
		s.Truncated = true
	}
}

// longerTail returns the stream with the longer non-empty tail, or nil.
func longerTail(a, b *bashtaskv1alpha1.StreamStatus) *bashtaskv1alpha1.StreamStatus {
	var best *bashtaskv1alpha1.StreamStatus
	for _, s := range []*bashtaskv1alpha1.StreamStatus{a, b} {
		if s != nil && s.Tail != "" && (best == nil || len(s.Tail) > len(best.Tail)) {
			best = s
		}
	}
	return best
}

// cutIndex returns the smallest rune boundary i such that the JSON-escaped
// length of tail[:i] is at least want bytes, or len(tail).
func cutIndex(tail string, want int) int {
	n := 0
	for i, r := range tail {
		if n >= want {
			return i
		}
		n += escapedLen(r, tail[i:])
	}
	return len(tail)
}

// escapedLen is the number of bytes encoding/json writes for the rune r
// found at the start of rest, including HTML escaping, which json.Marshal
// applies.
func escapedLen(r rune, rest string) int {
	switch {
	case r == '"' || r == '\\' || r == '\n' || r == '\r' || r == '\t':
		return 2
	case r < 0x20 || r == '<' || r == '>' || r == '&' || r == '\u2028' || r == '\u2029':
		return 6
	case r == utf8.RuneError:
		if _, size := utf8.DecodeRuneInString(rest); size == 1 {
			return 6 // an invalid byte, written as \ufffd
		}
		return 3
	default:
		return utf8.RuneLen(r)
	}
}
