package agent

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/testing/protocmp"
	"google.golang.org/protobuf/types/known/durationpb"

	agentv1 "github.com/bashtask/bashtask-operator/api/agent/v1"
	"github.com/bashtask/bashtask-operator/executor"
)

func TestRecoverStream(t *testing.T) {
	tests := map[string]struct {
		content    *string // nil: no spill file
		tailBytes  int
		spillLimit int64
		lastTotal  int64
		want       *agentv1.StreamStatus
	}{
		"whole stream in the tail": {
			content: ptr("before\n"), tailBytes: 64000, spillLimit: 1 << 20,
			want: &agentv1.StreamStatus{Tail: "before\n", TotalBytes: 7, Sha256: sha256hex([]byte("before\n")),
				Spill: &agentv1.Spill{Bytes: 7, Complete: true}},
		},
		"longer than the tail": {
			content: ptr("abcdefghij"), tailBytes: 4, spillLimit: 1 << 20,
			want: &agentv1.StreamStatus{Tail: "ghij", TotalBytes: 10, Truncated: true, Sha256: sha256hex([]byte("abcdefghij")),
				Spill: &agentv1.Spill{Bytes: 10, Complete: true}},
		},
		"tail starts on a rune boundary": {
			content: ptr("aé€"), tailBytes: 4, spillLimit: 1 << 20,
			want: &agentv1.StreamStatus{Tail: "€", TotalBytes: 6, Truncated: true, Sha256: sha256hex([]byte("aé€")),
				Spill: &agentv1.Spill{Bytes: 6, Complete: true}},
		},
		"invalid UTF-8 is replaced": {
			content: ptr("\xffok"), tailBytes: 64000, spillLimit: 1 << 20,
			want: &agentv1.StreamStatus{Tail: "\uFFFDok", TotalBytes: 3, Sanitized: true, Sha256: sha256hex([]byte("\xffok")),
				Spill: &agentv1.Spill{Bytes: 3, Complete: true}},
		},
		"spill limit reached: no checksum": {
			content: ptr("0123456789"), tailBytes: 64000, spillLimit: 10, lastTotal: 25,
			want: &agentv1.StreamStatus{Tail: "0123456789", TotalBytes: 25, Truncated: true,
				Spill: &agentv1.Spill{Bytes: 10}},
		},
		"progress saw more than the file holds": {
			content: ptr("abc"), tailBytes: 64000, spillLimit: 1 << 20, lastTotal: 5,
			want: &agentv1.StreamStatus{Tail: "abc", TotalBytes: 5, Truncated: true, Spill: &agentv1.Spill{Bytes: 3}},
		},
		"each invalid byte is replaced, as in the executor": {
			content: ptr("\xff\xfeok"), tailBytes: 64000, spillLimit: 1 << 20,
			want: &agentv1.StreamStatus{Tail: "\uFFFD\uFFFDok", TotalBytes: 4, Sanitized: true, Sha256: sha256hex([]byte("\xff\xfeok")),
				Spill: &agentv1.Spill{Bytes: 4, Complete: true}},
		},
		"replacements stay within the tail size": {
			content: ptr("\xff\xff"), tailBytes: 4, spillLimit: 1 << 20,
			want: &agentv1.StreamStatus{Tail: "\uFFFD", TotalBytes: 2, Truncated: true, Sanitized: true, Sha256: sha256hex([]byte("\xff\xff")),
				Spill: &agentv1.Spill{Bytes: 2, Complete: true}},
		},
		// The executor creates a spill file with the first byte.
		"no spill file: an empty stream": {
			tailBytes: 64000, spillLimit: 1 << 20,
			want: &agentv1.StreamStatus{Sha256: sha256hex(nil), Spill: &agentv1.Spill{Complete: true}},
		},
		"no spill file, bytes reported: its creation failed": {
			tailBytes: 64000, spillLimit: 1 << 20, lastTotal: 4,
			want: &agentv1.StreamStatus{TotalBytes: 4, Truncated: true, Spill: &agentv1.Spill{}},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "stdout")
			if tc.content != nil {
				if err := os.WriteFile(path, []byte(*tc.content), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			got, err := recoverStream(path, tc.tailBytes, tc.spillLimit, tc.lastTotal)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, got, protocmp.Transform()); diff != "" {
				t.Errorf("recovered stream (-want +got):\n%s", diff)
			}
		})
	}
}

// A recovered tail is the tail the executor would have reported for the
// same complete stream, whatever the stream and the tail size.
func TestRecoverStreamAgreesWithExecutor(t *testing.T) {
	streams := []string{"", "abc", "a€b€c€", "\xff\xfe\xe2\x82\xac\xf0\x9f\x98\x80x", strings.Repeat("é\xff", 40)}
	for _, stream := range streams {
		for n := range 12 {
			path := filepath.Join(t.TempDir(), "stdout")
			if err := os.WriteFile(path, []byte(stream), 0o600); err != nil {
				t.Fatal(err)
			}
			got, err := recoverStream(path, n, 1<<20, int64(len(stream)))
			if err != nil {
				t.Fatal(err)
			}
			tail, sanitized, truncated := executor.TailOf([]byte(stream), n)
			if got.GetTail() != tail || got.GetSanitized() != sanitized || got.GetTruncated() != truncated {
				t.Errorf("stream %q, tail size %d: recovered %q sanitized %v truncated %v; executor %q %v %v",
					stream, n, got.GetTail(), got.GetSanitized(), got.GetTruncated(), tail, sanitized, truncated)
			}
		}
	}
}

func TestBackoff(t *testing.T) {
	s := &Server{cfg: Config{UploadBackoffInitial: 100e6, UploadBackoffMax: 1e9}} // 100 ms, 1 s
	var got []bool
	for n, base := range []int64{100e6, 200e6, 400e6, 800e6, 1e9, 1e9} {
		d := int64(s.backoff(n + 1))
		// Within the base and its 10% jitter.
		got = append(got, d >= base && d <= base+base/10)
	}
	if diff := cmp.Diff([]bool{true, true, true, true, true, true}, got); diff != "" {
		t.Errorf("backoff within [base, base+10%%] per attempt (-want +got):\n%s", diff)
	}
}

func ptr[T any](v T) *T { return &v }

func TestPrepareStateDirNarrowsMode(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "state")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, 0o755); err != nil { // whatever the umask did
		t.Fatal(err)
	}
	if err := prepareStateDir(dir); err != nil {
		t.Fatal(err)
	}
	var got []os.FileMode
	for _, d := range []string{dir, filepath.Join(dir, "tasks")} {
		st, err := os.Stat(d)
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, st.Mode().Perm())
	}
	if diff := cmp.Diff([]os.FileMode{0o700, 0o700}, got); diff != "" {
		t.Errorf("modes (-want +got):\n%s", diff)
	}
	if err := prepareStateDir("relative/state"); err == nil {
		t.Error("prepareStateDir accepted a relative path")
	}
}

// kill_grace reaches the executor as asked, also under a second; absent
// takes the executor's default, and a present zero is no grace period
// (KillGraceNone), not the 3 s default.
func TestKillGrace(t *testing.T) {
	tests := map[string]struct {
		grace *durationpb.Duration
		want  time.Duration
	}{
		"absent: the executor's default":    {grace: nil, want: 0},
		"200ms":                             {grace: durationpb.New(200 * time.Millisecond), want: 200 * time.Millisecond},
		"zero: none":                        {grace: durationpb.New(0), want: executor.KillGraceNone},
		"negative: refused by the executor": {grace: durationpb.New(-time.Second), want: -time.Second},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			if got := killGrace(&agentv1.TaskSpec{KillGrace: tc.grace}); got != tc.want {
				t.Errorf("killGrace = %v, want %v", got, tc.want)
			}
		})
	}
}
