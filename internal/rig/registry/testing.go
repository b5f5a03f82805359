package registry

import (
	"archive/tar"
	"bytes"
	"cmp"
	"context"
	"encoding/base64"
	"fmt"
	"io"
	"maps"
	"net/http"
	"os"
	"runtime"
	"slices"
	"strings"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/bashtask/bashtask-operator/internal/rig/testutil"
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

// The machine's static bash and BusyBox (nodeimages.HostBashStatic and
// HostBusybox; that package's tests use this one, so it is not imported).
const (
	hostBashStatic = "/bin/bash-static"
	hostBusybox    = "/bin/busybox"
)

// BusyboxImage describes a test image of one layer made of the machine's
// static bash and BusyBox (Debian's bash-static and busybox-static; make
// test-packages installs them): /bin/busybox, /bin/bash unless NoBash, an
// applet link in /bin for each of Applets, /bin /etc /tmp and Dirs, an
// /etc/passwd and /etc/group naming root, Files, and set-user-ID copies
// of bash (SetUIDBash).
type BusyboxImage struct {
	// Arch is the config's architecture; empty means runtime.GOARCH.
	Arch string
	// NoBash leaves /bin/bash out (an image a task cannot run in).
	NoBash bool
	// Applets are BusyBox applets linked in /bin.
	Applets []string
	// Dirs are more directories, "usr/local/bin/" style, mode 0755.
	Dirs []string
	// Files are more regular files (mode 0644) by path and content.
	Files map[string]string
	// SetUIDBash are paths, "bin/suid-bash" style, of copies of the
	// static bash, owned by root and set-user-ID (mode 04755): a task
	// that runs one must not become root.
	SetUIDBash []string
}

// BuildForTest builds the image; a static binary missing from the
// machine skips t (fails it under BASHTASK_STRICT), any other failure
// fails it.
func (b BusyboxImage) BuildForTest(t testing.TB) v1.Image {
	t.Helper()
	for _, p := range []string{hostBashStatic, hostBusybox} {
		if _, err := os.Stat(p); err != nil {
			testutil.SkipUnlessStrictf(t, "%s missing (make test-packages installs it): %v", p, err)
		}
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	add := func(h *tar.Header, data []byte) {
		h.Size = int64(len(data))
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write(data); err != nil {
			t.Fatal(err)
		}
	}
	for _, d := range append([]string{"bin/", "etc/", "tmp/"}, b.Dirs...) {
		add(&tar.Header{Typeflag: tar.TypeDir, Name: d, Mode: 0o755}, nil)
	}
	file := func(name, from string) {
		data, err := os.ReadFile(from)
		if err != nil {
			t.Fatal(err)
		}
		mode := int64(0o755)
		if slices.Contains(b.SetUIDBash, name) {
			mode |= 0o4000
		}
		add(&tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: mode}, data)
	}
	file("bin/busybox", hostBusybox)
	if !b.NoBash {
		file("bin/bash", hostBashStatic)
	}
	for _, p := range b.SetUIDBash {
		file(p, hostBashStatic)
	}
	for _, a := range b.Applets {
		add(&tar.Header{Typeflag: tar.TypeSymlink, Name: "bin/" + a, Linkname: "busybox", Mode: 0o777}, nil)
	}
	files := map[string]string{"etc/passwd": "root:x:0:0:root:/root:/bin/sh\n", "etc/group": "root:x:0:\n"}
	maps.Copy(files, b.Files)
	for _, n := range slices.Sorted(maps.Keys(files)) {
		add(&tar.Header{Typeflag: tar.TypeReg, Name: n, Mode: 0o644}, []byte(files[n]))
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(buf.Bytes())), nil })
	if err != nil {
		t.Fatal(err)
	}
	img, err := mutate.AppendLayers(empty.Image, layer)
	if err != nil {
		t.Fatal(err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", cmp.Or(b.Arch, runtime.GOARCH)
	if img, err = mutate.ConfigFile(img, cf); err != nil {
		t.Fatal(err)
	}
	return img
}

// Test credentials of the repositories GuardPrivateForTest guards.
const (
	TestUser     = "tenant-a"
	TestPassword = "s3cret"
)

// GuardPrivateForTest wraps a registry's handler so that a repository
// whose path holds "/private/" wants basic authentication as TestUser and
// TestPassword, refused the way a registry refuses it (401 with a
// WWW-Authenticate challenge and an UNAUTHORIZED error).
func GuardPrivateForTest(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.Contains(r.URL.Path, "/private/") {
			if u, p, ok := r.BasicAuth(); !ok || u != TestUser || p != TestPassword {
				w.Header().Set("WWW-Authenticate", `Basic realm="test"`)
				w.WriteHeader(http.StatusUnauthorized)
				fmt.Fprint(w, `{"errors":[{"code":"UNAUTHORIZED","message":"authentication required"}]}`)
				return
			}
		}
		h.ServeHTTP(w, r)
	})
}

// TestDockerConfigJSON is the .dockerconfigjson (the value of a
// kubernetes.io/dockerconfigjson Secret) of TestUser and TestPassword for
// host.
func TestDockerConfigJSON(host string) []byte {
	auth := base64.StdEncoding.EncodeToString([]byte(TestUser + ":" + TestPassword))
	return fmt.Appendf(nil, `{"auths":{%q:{"auth":%q}}}`, host, auth)
}
