package packaging_test

import (
	"bytes"
	"crypto/tls"
	"encoding/base64"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"testing"
	"time"

	"github.com/bashtask/bashtask-operator/internal/tlsutil"
)

// TestChartCertificates checks the certificates the chart generates with
// the binaries' own TLS code: the controller's client configuration (which
// checks the agents' server name) and the agent's server configuration
// (which accepts only the controller identity) complete a handshake.
func TestChartCertificates(t *testing.T) {
	objs := render(t, renderings()[0])
	dirs := map[string]string{}
	for _, o := range objs {
		if o.GetKind() != "Secret" {
			continue
		}
		dir := t.TempDir()
		for _, key := range []string{"ca.crt", "tls.crt", "tls.key"} {
			v, _, _ := unstructuredString(o.Object, "data", key)
			data, err := base64.StdEncoding.DecodeString(v)
			if err != nil || len(data) == 0 {
				t.Fatalf("Secret %s key %s: empty or not base64 (%v)", o.GetName(), key, err)
			}
			if err := os.WriteFile(filepath.Join(dir, key), data, 0o600); err != nil {
				t.Fatal(err)
			}
		}
		dirs[o.GetName()] = dir
	}
	agentDir, controllerDir := dirs["bt-bashtask-agent-tls"], dirs["bt-bashtask-controller-tls"]
	if agentDir == "" || controllerDir == "" {
		t.Fatalf("want Secrets bt-bashtask-agent-tls and bt-bashtask-controller-tls, have %v", keys(dirs))
	}
	files := func(dir string) *tlsutil.Files {
		f, err := tlsutil.NewFiles(filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key"), filepath.Join(dir, "ca.crt"))
		if err != nil {
			t.Fatal(err)
		}
		return f
	}
	// The controller's defaults: --agent-server-name <service>.<namespace>.svc;
	// the agent's: --controller-identity bashtask-controller.
	serverCfg, err := tlsutil.ServerConfig(files(agentDir), "bashtask-controller")
	if err != nil {
		t.Fatal(err)
	}
	clientCfg, err := tlsutil.ClientConfig(files(controllerDir), "bt-bashtask-agent."+chartNamespace+".svc")
	if err != nil {
		t.Fatal(err)
	}
	if err := handshake(clientCfg, serverCfg); err != nil {
		t.Fatalf("handshake between the chart's controller and agent certificates: %v", err)
	}

	// The other way round must fail: the agent's certificate is no client
	// identity the agents accept.
	wrongClient, err := tlsutil.ClientConfig(files(agentDir), "bt-bashtask-agent."+chartNamespace+".svc")
	if err != nil {
		t.Fatal(err)
	}
	if err := handshake(wrongClient, serverCfg); err == nil {
		t.Errorf("an agent accepted the agent certificate as a controller")
	}
}

func handshake(clientCfg, serverCfg *tls.Config) error {
	c, s := net.Pipe()
	defer c.Close()
	defer s.Close()
	deadline := time.Now().Add(10 * time.Second)
	_ = c.SetDeadline(deadline)
	_ = s.SetDeadline(deadline)
	errc := make(chan error, 1)
	go func() {
		srv := tls.Server(s, serverCfg)
		err := srv.Handshake()
		if err == nil {
			// TLS 1.3 client certificates are checked after the client's
			// handshake returns: read so the server's verdict reaches it.
			_, err = srv.Write([]byte("ok"))
		}
		if err != nil {
			s.Close()
		}
		errc <- err
	}()
	cl := tls.Client(c, clientCfg)
	err := cl.Handshake()
	if err == nil {
		buf := make([]byte, 2)
		_, err = cl.Read(buf)
	}
	if serr := <-errc; err == nil {
		err = serr
	}
	return err
}

func unstructuredString(obj map[string]any, fields ...string) (string, bool, error) {
	var cur any = obj
	for _, f := range fields {
		m, ok := cur.(map[string]any)
		if !ok {
			return "", false, nil
		}
		cur = m[f]
	}
	s, ok := cur.(string)
	return s, ok, nil
}

// TestChartCopiesOfGeneratedFiles checks that the chart's CRD and RBAC
// rules are the files controller-gen generated into config/.
func TestChartCopiesOfGeneratedFiles(t *testing.T) {
	pairs := map[string]string{
		"config/crd/bases/bashtask.dev_bashtasks.yaml":      "charts/bashtask/crds/bashtask.dev_bashtasks.yaml",
		"config/crd/bases/bashtask.dev_bashworkspaces.yaml": "charts/bashtask/crds/bashtask.dev_bashworkspaces.yaml",
		"config/rbac/role.yaml":                             "charts/bashtask/files/controller-role.yaml",
	}
	for src, dst := range pairs {
		a, err := os.ReadFile(filepath.Join(root, src))
		if err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile(filepath.Join(root, dst))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(a, b) {
			t.Errorf("%s differs from %s: run make manifests", dst, src)
		}
	}
}

// TestRenderedFlagsExist checks that every flag the chart and
// config/default pass to the binaries is one the binaries define, by their
// --help output.
func TestRenderedFlagsExist(t *testing.T) {
	bin := t.TempDir()
	build := exec.CommandContext(t.Context(), "go", "build", "-o", bin+"/", "./cmd/bashtask-controller", "./cmd/bashtask-agent")
	build.Dir = root
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	known := map[string]map[string]bool{}
	flagRE := regexp.MustCompile(`(?m)^\s+(?:-\w, )?--([a-z0-9-]+)`)
	for name, args := range map[string][]string{
		"controller": {filepath.Join(bin, "bashtask-controller"), "--help"},
		"agent":      {filepath.Join(bin, "bashtask-agent"), "serve", "--help"},
		// The chart's pre-delete hook.
		"release-tasks": {filepath.Join(bin, "bashtask-controller"), "release-tasks", "--help"},
	} {
		out, err := exec.CommandContext(t.Context(), args[0], args[1:]...).CombinedOutput()
		if err != nil {
			t.Fatalf("%v: %v\n%s", args, err, out)
		}
		known[name] = map[string]bool{}
		for _, m := range flagRE.FindAllStringSubmatch(string(out), -1) {
			known[name][m[1]] = true
		}
	}
	for _, r := range renderings() {
		for _, o := range render(t, r) {
			var component string
			switch o.GetKind() {
			case "Deployment":
				component = "controller"
			case "DaemonSet":
				component = "agent"
			case "Job":
				component = "release-tasks"
			default:
				continue
			}
			containers, _, _ := unstructuredSlice(o.Object, "spec", "template", "spec", "containers")
			for _, c := range containers {
				args, _ := c.(map[string]any)["args"].([]any)
				for _, a := range args {
					s, _ := a.(string)
					for name := range flagValues([]string{s}) {
						if !known[component][name] {
							t.Errorf("%s: %s passes --%s, which bashtask-%s does not define", r.name, o.GetKind(), name, component)
						}
					}
				}
			}
		}
	}
}

func unstructuredSlice(obj map[string]any, fields ...string) ([]any, bool, error) {
	var cur any = obj
	for _, f := range fields {
		m, ok := cur.(map[string]any)
		if !ok {
			return nil, false, nil
		}
		cur = m[f]
	}
	s, ok := cur.([]any)
	return s, ok, nil
}
