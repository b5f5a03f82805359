package plugin

import (
	"strings"
	"testing"
)

func TestLogsStream(t *testing.T) {
	tests := map[string]struct {
		flags   logsFlags
		want    string
		wantErr string
	}{
		"default stdout":           {want: "stdout"},
		"--stderr":                 {flags: logsFlags{stderr: true}, want: "stderr"},
		"--stream all":             {flags: logsFlags{stream: "all"}, want: "all"},
		"--stderr --stream stderr": {flags: logsFlags{stderr: true, stream: "stderr"}, want: "stderr"},
		"--stderr --stream all":    {flags: logsFlags{stderr: true, stream: "all"}, wantErr: "--stderr and --stream all name different streams"},
		"--stream both":            {flags: logsFlags{stream: "both"}, wantErr: `--stream "both": must be stdout, stderr or all`},
		"--stream all --tail-ok":   {flags: logsFlags{stream: "all", tailOK: true}, wantErr: "--tail-ok and --tail-only apply to one stream"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got, err := logsStream(tc.flags)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("logsStream = %q, %v; want an error with %q", got, err, tc.wantErr)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("logsStream = %q, %v; want %q", got, err, tc.want)
			}
		})
	}
}
