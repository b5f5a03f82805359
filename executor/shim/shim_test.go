package shim

import (
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestParseReport(t *testing.T) {
	tests := map[string]struct {
		line    string
		want    Report
		wantErr bool
	}{
		"step failed":   {line: "error mounts: making / read-only: EPERM", want: Report{Step: "mounts", Err: "making / read-only: EPERM"}},
		"started":       {line: "started 10", want: Report{PID: 10}},
		"exit":          {line: "exit 15", want: Report{Exited: true, Status: 15}},
		"garbage":       {line: "hello", wantErr: true},
		"bad exit":      {line: "exit x", wantErr: true},
		"started no id": {line: "started", wantErr: true},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got, err := ParseReport(tc.line)
			if (err != nil) != tc.wantErr {
				t.Fatalf("err = %v, want error %v", err, tc.wantErr)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("(-want +got)\n%s", diff)
			}
		})
	}
}
