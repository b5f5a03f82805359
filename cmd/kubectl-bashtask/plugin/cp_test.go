package plugin

import (
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestParseRemote(t *testing.T) {
	tests := map[string]struct {
		arg     string
		want    remoteSpec
		remote  bool
		wantErr bool
	}{
		"workspace and path":     {arg: "s1:src/a.go", want: remoteSpec{workspace: "s1", path: "src/a.go"}, remote: true},
		"namespace":              {arg: "team-a/s1:/home/task", want: remoteSpec{namespace: "team-a", workspace: "s1", path: "/home/task"}, remote: true},
		"the root":               {arg: "s1:", want: remoteSpec{workspace: "s1"}, remote: true},
		"a local path":           {arg: "src/a.go"},
		"an absolute local path": {arg: "/tmp/a:b"},
		"a dotted local path":    {arg: "./a:b"},
		"a leading colon":        {arg: ":x"},
		"a bad workspace name":   {arg: "S_1:x", remote: true, wantErr: true},
		"a bad namespace":        {arg: "A/s1:x", remote: true, wantErr: true},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got, remote, err := parseRemote(tc.arg)
			if (err != nil) != tc.wantErr || remote != tc.remote {
				t.Fatalf("parseRemote(%q) = remote %v, err %v; want remote %v, error %v", tc.arg, remote, err, tc.remote, tc.wantErr)
			}
			if diff := cmp.Diff(tc.want, got, cmp.AllowUnexported(remoteSpec{})); err == nil && diff != "" {
				t.Errorf("parseRemote(%q) (-want +got):\n%s", tc.arg, diff)
			}
		})
	}
}
