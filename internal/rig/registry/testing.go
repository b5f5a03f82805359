package registry

import (
	"context"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
)

// StartForTest starts a registry on a temporary directory of t and stops
// it when t ends; a failure to start fails t.
func StartForTest(t testing.TB) *Registry {
	t.Helper()
	r, err := Start(Options{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := r.Close(); err != nil {
			t.Errorf("stopping the registry: %v", err)
		}
	})
	return r
}

// PushForTest pushes img to repo:tag of r and returns its reference by
// digest (HOST/REPO@sha256:...); a failure fails t.
func PushForTest(t testing.TB, r *Registry, img v1.Image, repo, tag string) string {
	t.Helper()
	d, err := r.Push(context.Background(), img, repo, tag)
	if err != nil {
		t.Fatal(err)
	}
	return d.String()
}
