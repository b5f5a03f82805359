package main

import (
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestPick(t *testing.T) {
	all := phases()
	for _, tc := range []struct {
		list    string
		want    []string
		wantErr bool
	}{
		{list: "system,executor", want: []string{"executor", "system"}},
		{list: "output, system,", want: []string{"output", "system"}},
		{list: "executor,output,snapshot,resume,system", want: []string{"executor", "snapshot", "resume", "output", "system"}},
		{list: "workspace", want: []string{"workspace"}},
		{list: "system,images,snapshot", want: []string{"snapshot", "images", "system"}},
		{list: "bogus", wantErr: true},
		{list: "", wantErr: true},
	} {
		got, err := pick(all, tc.list)
		if (err != nil) != tc.wantErr {
			t.Errorf("pick(%q) error %v, want an error: %v", tc.list, err, tc.wantErr)
			continue
		}
		var names []string
		for _, p := range got {
			names = append(names, p.Name())
		}
		if diff := cmp.Diff(tc.want, names); diff != "" {
			t.Errorf("pick(%q) (-want +got):\n%s", tc.list, diff)
		}
	}
}
