package executor

import (
	"bytes"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/google/go-cmp/cmp"
)

type tailOut struct {
	Tail                 string
	Total                int64
	Truncated, Sanitized bool
}

// referenceTail renders a whole stream's tail through the exported TailOf,
// the rule the agent's recovery uses too; the ring buffer must agree with
// it for any chunking, so a recovered tail and a live one never differ.
func referenceTail(stream []byte, max int) tailOut {
	tail, sanitized, truncated := TailOf(bytes.Clone(stream), max)
	return tailOut{tail, int64(len(stream)), truncated, sanitized}
}

func writeChunks(max int, chunks [][]byte) tailOut {
	tb := newTailBuffer(max)
	for _, c := range chunks {
		tb.Write(c)
	}
	tail, truncated, sanitized := tb.snapshot(true)
	return tailOut{tail, tb.total, truncated, sanitized}
}

func TestTailBuffer(t *testing.T) {
	euro := "€" // 3 bytes: e2 82 ac
	tests := []struct {
		name   string
		max    int
		chunks []string
		want   tailOut
	}{
		{"empty", 8, nil, tailOut{"", 0, false, false}},
		{"short", 8, []string{"ab", "cd"}, tailOut{"abcd", 4, false, false}},
		{"exactly max is not truncated", 4, []string{"ab", "cd"}, tailOut{"abcd", 4, false, false}},
		{"one over", 4, []string{"abcde"}, tailOut{"bcde", 5, true, false}},
		{"wraps in small writes", 4, []string{"ab", "cd", "ef", "g"}, tailOut{"defg", 7, true, false}},
		{"big write replaces all", 4, []string{"ab", "0123456789"}, tailOut{"6789", 12, true, false}},
		{"cut inside a character skips forward", 4, []string{"a" + euro + "bc"}, tailOut{"bc", 6, true, false}},
		{"cut before a character keeps it", 5, []string{"a" + euro + "bc"}, tailOut{euro + "bc", 6, true, false}},
		{"invalid byte replaced", 8, []string{"a\xffb"}, tailOut{"a\uFFFDb", 3, false, true}},
		{"replacement growth keeps the bound", 4, []string{"\xff\xff"}, tailOut{"\uFFFD", 2, true, true}},
		{"lone continuation bytes at the start of the whole stream are replaced", 8, []string{"\x82\xacz"}, tailOut{"\uFFFD\uFFFDz", 3, false, true}},
		{"truncated invalid sequence at the end is replaced when final", 8, []string{"ab\xe2\x82"}, tailOut{"ab\uFFFD\uFFFD", 4, false, true}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var chunks [][]byte
			var whole []byte
			for _, c := range tc.chunks {
				chunks = append(chunks, []byte(c))
				whole = append(whole, c...)
			}
			if diff := cmp.Diff(tc.want, writeChunks(tc.max, chunks)); diff != "" {
				t.Errorf("ring buffer (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tc.want, referenceTail(whole, tc.max)); diff != "" {
				t.Errorf("reference (-want +got):\n%s", diff)
			}
		})
	}
}

func TestTailSnapshotHoldsBackIncompleteCharacterWhileRunning(t *testing.T) {
	tb := newTailBuffer(16)
	tb.Write([]byte("ab\xe2\x82"))
	tail, _, sanitized := tb.snapshot(false)
	if tail != "ab" || sanitized {
		t.Fatalf("running snapshot = %q sanitized=%v, want %q without sanitizing", tail, sanitized, "ab")
	}
	tb.Write([]byte("\xac"))
	if tail, _, _ := tb.snapshot(false); tail != "ab€" {
		t.Fatalf("snapshot after completion = %q, want %q", tail, "ab€")
	}
}

func TestTailBufferMemoryIsBounded(t *testing.T) {
	tb := newTailBuffer(1000)
	chunk := []byte(strings.Repeat("x", 333))
	for range 10000 {
		tb.Write(chunk)
	}
	if cap(tb.buf) > 1000 {
		t.Fatalf("tail buffer capacity %d exceeds its limit 1000", cap(tb.buf))
	}
	if tb.total != 3330000 {
		t.Fatalf("total = %d, want 3330000", tb.total)
	}
}

func TestTailBufferNoOutputAllocatesNothing(t *testing.T) {
	tb := newTailBuffer(DefaultTailBytes)
	if tb.buf != nil {
		t.Fatalf("fresh tail buffer holds %d bytes of memory", cap(tb.buf))
	}
}

// FuzzTail feeds arbitrary bytes, in arbitrary chunks, through the ring
// buffer and checks the rendered tail against the reference and against
// the contract: valid UTF-8, within the limit, a suffix of the stream when
// the stream is valid UTF-8, and "not truncated" only when it is the whole
// stream.
func FuzzTail(f *testing.F) {
	f.Add([]byte("hello, world"), uint16(5), uint8(3))
	f.Add([]byte("a€b€c€"), uint16(4), uint8(1))
	f.Add([]byte("\xff\xfe\xe2\x82\xac\xf0\x9f\x98"), uint16(6), uint8(2))
	f.Add(bytes.Repeat([]byte("line-0001\n"), 50), uint16(64), uint8(7))
	f.Fuzz(func(t *testing.T, stream []byte, max uint16, step uint8) {
		limit := int(max%512) + 1
		n := int(step%64) + 1
		var chunks [][]byte
		for rest := stream; len(rest) > 0; {
			k := min(n, len(rest))
			chunks = append(chunks, rest[:k])
			rest = rest[k:]
			n = n*7%97 + 1 // vary chunk sizes deterministically
		}
		got := writeChunks(limit, chunks)
		if diff := cmp.Diff(referenceTail(stream, limit), got); diff != "" {
			t.Fatalf("ring buffer differs from reference (-want +got):\n%s", diff)
		}
		if !utf8.ValidString(got.Tail) {
			t.Fatalf("tail %q is not valid UTF-8", got.Tail)
		}
		if len(got.Tail) > limit {
			t.Fatalf("tail of %d bytes exceeds limit %d", len(got.Tail), limit)
		}
		if got.Total != int64(len(stream)) {
			t.Fatalf("total %d, want %d", got.Total, len(stream))
		}
		if !got.Truncated && got.Sanitized == utf8.Valid(stream) {
			t.Fatalf("uncut stream: sanitized=%v but stream validity is %v", got.Sanitized, utf8.Valid(stream))
		}
		if utf8.Valid(stream) {
			if got.Sanitized || !strings.HasSuffix(string(stream), got.Tail) {
				t.Fatalf("valid stream: tail %q sanitized=%v is not a plain suffix", got.Tail, got.Sanitized)
			}
			if len(stream) <= limit && (got.Truncated || got.Tail != string(stream)) {
				t.Fatalf("valid stream within the limit: tail %q truncated=%v, want the whole stream", got.Tail, got.Truncated)
			}
		}
		if !got.Truncated && !got.Sanitized && got.Tail != string(stream) {
			t.Fatalf("not truncated, not sanitized, but tail %q != stream %q", got.Tail, stream)
		}
	})
}

func TestTailOf(t *testing.T) {
	type out struct {
		Tail                 string
		Sanitized, Truncated bool
	}
	tests := map[string]struct {
		stream string
		n      int
		want   out
	}{
		"empty":                            {"", 4, out{"", false, false}},
		"whole stream":                     {"abcd", 4, out{"abcd", false, false}},
		"cut":                              {"abcde", 4, out{"bcde", false, true}},
		"cut inside a character":           {"a€bc", 4, out{"bc", false, true}},
		"each invalid byte is replaced":    {"\xff\xfeok", 8, out{"\uFFFD\uFFFDok", true, false}},
		"replacements stay within n":       {"\xff\xff", 4, out{"\uFFFD", true, true}},
		"zero keeps nothing":               {"abc", 0, out{"", false, true}},
		"negative is zero":                 {"abc", -1, out{"", false, true}},
		"zero of an empty stream is whole": {"", 0, out{"", false, false}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			var got out
			got.Tail, got.Sanitized, got.Truncated = TailOf([]byte(tc.stream), tc.n)
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("TailOf(%q, %d) (-want +got):\n%s", tc.stream, tc.n, diff)
			}
		})
	}
}

// FuzzTailOfSuffix checks the promise of TailOf's doc: the last n+1 bytes
// of a stream give the same tail as the whole stream, which is what the
// agent's recovery reads from a spill file.
func FuzzTailOfSuffix(f *testing.F) {
	f.Add([]byte("hello, world"), uint16(5))
	f.Add([]byte("a€b€c€"), uint16(4))
	f.Add([]byte("\xff\xfe\xe2\x82\xac\xf0\x9f\x98"), uint16(3))
	f.Fuzz(func(t *testing.T, stream []byte, max uint16) {
		n := int(max % 512)
		if len(stream) <= n {
			return
		}
		wt, ws, wc := TailOf(stream, n)
		gt, gs, gc := TailOf(stream[len(stream)-n-1:], n)
		if wt != gt || ws != gs || wc != gc {
			t.Fatalf("TailOf(whole, %d) = %q %v %v, TailOf(last n+1 bytes) = %q %v %v", n, wt, ws, wc, gt, gs, gc)
		}
	})
}
