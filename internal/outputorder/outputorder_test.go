package outputorder

import (
	"bytes"
	"errors"
	"testing"
)

// frame renders records over the two streams' bytes from framed offset
// from, the way the agent and the output API serve them.
func frame(t *testing.T, recs []Record, streams [3][]byte, from int64) []byte {
	t.Helper()
	var out []byte
	var c Cursor
	for _, r := range recs {
		if err := c.Walk(r, from, func(p Piece) error {
			if len(p.Header) > 0 {
				out = append(out, p.Header...)
				return nil
			}
			out = append(out, streams[p.Stream][p.Offset:p.Offset+p.Len]...)
			return nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	return out
}

func TestJournalRoundTripAndFrames(t *testing.T) {
	recs := []Record{{Stdout, 5}, {Stderr, 3}, {Stdout, MaxFramePayload + 2}, {Stderr, 1}}
	var j []byte
	for i, r := range recs {
		j = AppendRecord(j, r, i == 0)
	}
	got, err := Parse(j)
	if err != nil || len(got) != len(recs) {
		t.Fatalf("Parse = %v, %v", got, err)
	}
	// Fed a byte at a time, the parser sees the same records.
	var p Parser
	n := 0
	for i := range j {
		if err := p.Feed(j[i:i+1], func(r Record) error {
			if r != recs[n] {
				t.Fatalf("record %d = %+v, want %+v", n, r, recs[n])
			}
			n++
			return nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	if n != len(recs) || p.Sums[Stdout] != MaxFramePayload+7 || p.Sums[Stderr] != 4 {
		t.Fatalf("fed bytewise: %d records, sums %v", n, p.Sums)
	}
	// A torn last record counts for nothing.
	if got, err := Parse(j[:len(j)-1]); err != nil || len(got) != len(recs)-1 {
		t.Fatalf("torn: %v, %v", got, err)
	}
	if _, err := Parse([]byte{9, 2}); !errors.Is(err, ErrJournal) {
		t.Fatalf("bad version: %v", err)
	}

	out := bytes.Repeat([]byte("o"), MaxFramePayload+7)
	streams := [3][]byte{nil, out, []byte("eeee")}
	whole := frame(t, recs, streams, 0)
	var want []byte
	var total int64
	for _, r := range recs {
		total += FramedLen(r)
	}
	if int64(len(whole)) != total {
		t.Fatalf("framed %d bytes, FramedLen says %d", len(whole), total)
	}
	want = append(want, 1, 0, 0, 0, 0, 0, 0, 5)
	want = append(want, "ooooo"...)
	want = append(want, 2, 0, 0, 0, 0, 0, 0, 3)
	want = append(want, "eee"...)
	if !bytes.Equal(whole[:len(want)], want) {
		t.Fatalf("framed starts %q, want %q", whole[:len(want)], want)
	}
	// The record over 1 MiB is two frames.
	second := whole[len(want)+HeaderBytes+MaxFramePayload:]
	if !bytes.Equal(second[:HeaderBytes], []byte{1, 0, 0, 0, 0, 0, 0, 2}) {
		t.Fatalf("second frame's header %v", second[:HeaderBytes])
	}
	// Every offset resumes with the same bytes, also inside a header.
	for _, from := range []int64{1, 7, 8, 9, 13, 14, 20, int64(len(want)) + 3, int64(len(whole)) - 2, int64(len(whole))} {
		if got := frame(t, recs, streams, from); !bytes.Equal(got, whole[from:]) {
			t.Fatalf("from %d: %d bytes, want %d", from, len(got), len(whole)-int(from))
		}
	}
}

func TestRest(t *testing.T) {
	got := Rest([3]int64{0, 4, 2}, [3]int64{0, 10, 3})
	want := []Record{{Stdout, 6}, {Stderr, 1}}
	if len(got) != 2 || got[0] != want[0] || got[1] != want[1] {
		t.Fatalf("Rest = %v, want %v", got, want)
	}
	if got := Rest([3]int64{0, 4, 2}, [3]int64{0, 4, 2}); len(got) != 0 {
		t.Fatalf("Rest of a whole journal = %v", got)
	}
}
