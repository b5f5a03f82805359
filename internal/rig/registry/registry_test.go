package registry

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/remote"
)

// pull fetches ref's manifest digest and every layer's bytes, failing t
// on any error.
func pull(t *testing.T, ref string) v1.Hash {
	t.Helper()
	r, err := name.ParseReference(ref)
	if err != nil {
		t.Fatal(err)
	}
	img, err := remote.Image(r)
	if err != nil {
		t.Fatalf("pulling %s: %v", ref, err)
	}
	ls, err := img.Layers()
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range ls {
		rc, err := l.Compressed()
		if err != nil {
			t.Fatalf("layer of %s: %v", ref, err)
		}
		rc.Close()
	}
	d, err := img.Digest()
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// TestPushPull pushes an image and pulls it back by tag and by digest.
func TestPushPull(t *testing.T) {
	r := StartForTest(t)
	img, err := random.Image(1<<16, 3)
	if err != nil {
		t.Fatal(err)
	}
	want, _ := img.Digest()
	ref := PushForTest(t, r, img, "bashtask/test", "v1")
	if wantRef := r.Host() + "/bashtask/test@" + want.String(); ref != wantRef {
		t.Errorf("Push = %s, want %s", ref, wantRef)
	}
	if got := pull(t, r.Ref("bashtask/test", "v1")); got != want {
		t.Errorf("by tag: digest %s, want %s", got, want)
	}
	if got := pull(t, ref); got != want {
		t.Errorf("by digest: digest %s, want %s", got, want)
	}
	blobs, _ := filepath.Glob(filepath.Join(r.Dir(), "blobs", "sha256", "*"))
	if len(blobs) != 4 { // three layers and the config
		t.Errorf("blobs on disk: %d, want 4", len(blobs))
	}
}

// TestRestart stops a registry and starts another on its directory: the
// image is still there by tag and by digest, and a tag pushed twice names
// the second image.
func TestRestart(t *testing.T) {
	dir := t.TempDir()
	r, err := Start(Options{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	first, _ := random.Image(1<<10, 1)
	second, _ := random.Image(1<<10, 2)
	if _, err := r.Push(context.Background(), first, "bashtask/test", "v1"); err != nil {
		t.Fatal(err)
	}
	d, err := r.Push(context.Background(), second, "bashtask/test", "v1")
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	records, _ := os.ReadDir(filepath.Join(dir, "manifests"))
	if len(records) != 1 {
		t.Errorf("%d manifest records after pushing one tag twice, want 1", len(records))
	}

	r2, err := Start(Options{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	defer r2.Close()
	want, _ := second.Digest()
	if got := pull(t, r2.Ref("bashtask/test", "v1")); got != want {
		t.Errorf("after the restart, by tag: %s, want %s", got, want)
	}
	if got := pull(t, strings.Replace(d.String(), r.Host(), r2.Host(), 1)); got != want {
		t.Errorf("after the restart, by digest: %s, want %s", got, want)
	}
}

// TestStartErrors checks that a missing directory and an address that is
// not a loopback one are refused, naming what is wrong.
func TestStartErrors(t *testing.T) {
	for _, tc := range []struct {
		o    Options
		want string
	}{
		{Options{}, "Options.Dir is required"},
		{Options{Dir: t.TempDir(), Addr: "0.0.0.0:0"}, "must be a loopback address"},
		{Options{Dir: t.TempDir(), Addr: "nonsense"}, `address "nonsense"`},
	} {
		r, err := Start(tc.o)
		if err == nil {
			r.Close()
			t.Errorf("Start(%+v) succeeded, want an error with %q", tc.o, tc.want)
			continue
		}
		if !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Start(%+v) = %v, want an error with %q", tc.o, err, tc.want)
		}
	}
}

// TestAnyHostAndWrap starts a registry on every address (AnyHost) with
// GuardPrivateForTest wrapped around it: a private repository refuses an
// anonymous push and takes one with the test's credentials.
func TestAnyHostAndWrap(t *testing.T) {
	r, err := Start(Options{Dir: t.TempDir(), Addr: "0.0.0.0:0", AnyHost: true, Wrap: GuardPrivateForTest})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	_, port, _ := net.SplitHostPort(r.Host())
	img, _ := random.Image(1<<10, 1)
	ref, err := name.NewTag("127.0.0.1:" + port + "/bashtask/private/test:v1")
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(ref, img); err == nil || !strings.Contains(err.Error(), "401") {
		t.Fatalf("anonymous push to a private repository: %v, want a 401", err)
	}
	if err := remote.Write(ref, img, remote.WithAuth(&authn.Basic{Username: TestUser, Password: TestPassword})); err != nil {
		t.Fatalf("push with the test's credentials: %v", err)
	}
}
