package shim

import (
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestParseReport(t *testing.T) {
	tests := map[string]struct {
		line    string
		want    Report
		wantErr bool
	}{
		"ready":                                 {line: "ready " + Protocol, want: Report{Ready: true}},
		"ready of a shim from before protocols": {line: "ready", wantErr: true},
		"ready of another protocol":             {line: "ready 0", wantErr: true},
		"step failed":                           {line: "error mounts: making / read-only: EPERM", want: Report{Step: "mounts", Err: "making / read-only: EPERM"}},
		"started":                               {line: "started 10", want: Report{PID: 10}},
		"exit":                                  {line: "exit 15", want: Report{Exited: true, Status: 15}},
		"fenced":                                {line: "fenced", want: Report{Fenced: true}},
		"garbage":                               {line: "hello", wantErr: true},
		"bad exit":                              {line: "exit x", wantErr: true},
		"started no id":                         {line: "started", wantErr: true},
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

// The agent and a shim binary of another build must not agree on a Config
// they read differently: a change to Config's fields fails this test until
// Protocol is bumped and the list below updated with it.
func TestProtocolCoversConfig(t *testing.T) {
	const wantProtocol = "8"
	want := strings.Join([]string{
		"Shell string shell", "Command string command", "Env []string env",
		"WorkDir string workDir", "WorkTree bool workTree,omitempty",
		"Terminal *shim.TerminalConfig terminal,omitempty", "NullStdin bool nullStdin,omitempty",
		"TmpSizeBytes int64 tmpSizeBytes,omitempty", "Mask []string mask,omitempty",
		"Hostname string hostname,omitempty", "Loopback bool loopback,omitempty",
		"ResolvConf string resolvConf,omitempty", "RunPaths []string runPaths,omitempty",
		"NProc uint64 nproc,omitempty", "UID *uint32 uid,omitempty", "GID *uint32 gid,omitempty",
		"User *shim.UserEntry user,omitempty",
		"Landlock bool landlock,omitempty", "SeccompFilter []uint8 seccompFilter,omitempty",
		"NetNS bool netns,omitempty", "Workspace *shim.WorkspaceConfig workspace,omitempty",
		"LeaseMillis int64 leaseMillis,omitempty", "Root *shim.RootConfig root,omitempty",
	}, "\n")
	var got []string
	ct := reflect.TypeFor[Config]()
	for i := range ct.NumField() {
		f := ct.Field(i)
		got = append(got, fmt.Sprintf("%s %s %s", f.Name, f.Type, f.Tag.Get("json")))
	}
	if g := strings.Join(got, "\n"); g != want || Protocol != wantProtocol {
		t.Errorf("Config's fields are now\n%s\nwith Protocol %q: a change to them bumps Protocol; then update this test's list and wantProtocol", g, Protocol)
	}
}

func TestCheckRunPath(t *testing.T) {
	for p, ok := range map[string]bool{
		"/run/docker.sock": true, "/run/dbus/system_bus_socket": true,
		"/run": false, "/run/": false, "run/x.sock": false, "/var/run/x.sock": false,
		"/run/../etc/shadow": false, "/run/a/../b": false, "/run//x": false, "/run/x/": false,
		"/runner/x": false, "": false,
	} {
		if err := CheckRunPath(p); (err == nil) != ok {
			t.Errorf("CheckRunPath(%q) = %v, want ok %v", p, err, ok)
		}
	}
}

func TestPasswdWithUser(t *testing.T) {
	u := UserEntry{Name: "task", Gecos: "BashTask task", Home: "/home/task"}
	node := "root:x:0:0:root:/root:/bin/bash\n# comment\ntask:x:1000:1000::/home/x:/bin/sh\nold:x:2000131:5::/:/bin/sh\nnobody:x:65534:65534::/:/usr/sbin/nologin"
	want := "root:x:0:0:root:/root:/bin/bash\n# comment\nnobody:x:65534:65534::/:/usr/sbin/nologin\n" +
		"task:x:2000131:2000131:BashTask task:/home/task:/bin/bash\n"
	if diff := cmp.Diff(want, string(PasswdWithUser([]byte(node), u, 2000131, 2000131, "/bin/bash"))); diff != "" {
		t.Errorf("passwd (-want +got)\n%s", diff)
	}
	group := "root:x:0:\ntask:x:7:\nother:x:2000131:a,b\nusers:x:100:\n"
	wantGroup := "root:x:0:\nusers:x:100:\ntask:x:2000131:\n"
	if diff := cmp.Diff(wantGroup, string(GroupWithUser([]byte(group), "task", 2000131))); diff != "" {
		t.Errorf("group (-want +got)\n%s", diff)
	}
	if got := string(PasswdWithUser(nil, u, 5, 6, "/bin/sh")); got != "task:x:5:6:BashTask task:/home/task:/bin/sh\n" {
		t.Errorf("from no node file: %q", got)
	}
}

func TestUserEntryValidate(t *testing.T) {
	ok := UserEntry{Name: "task", Gecos: "BashTask task", Home: "/home/task", PrivateHome: true}
	if err := ok.Validate(); err != nil {
		t.Errorf("%+v: %v", ok, err)
	}
	for name, u := range map[string]UserEntry{
		"empty name":         {Home: "/home/task"},
		"colon in name":      {Name: "a:b", Home: "/home/task"},
		"newline in gecos":   {Name: "task", Gecos: "a\nroot:x:0:0::/:/bin/sh", Home: "/home/task"},
		"relative home":      {Name: "task", Home: "home/task"},
		"private home at /x": {Name: "task", Home: "/task", PrivateHome: true},
		"leading dash":       {Name: "-task", Home: "/home/task"},
		"name over 32 bytes": {Name: strings.Repeat("t", 33), Home: "/home/task"},
	} {
		if err := u.Validate(); err == nil {
			t.Errorf("%s: %+v accepted", name, u)
		}
	}
}

// A RootConfig's paths are checked before anything is mounted: clean,
// lower directories absolute, upper and work directories free of "..".
func TestRootConfigValidate(t *testing.T) {
	good := RootConfig{Image: "img", LowerDirs: []string{"/l/2", "/l/1"}, UpperDir: ".bashtask-root/upper", WorkDir: "/w"}
	if err := good.Validate(); err != nil {
		t.Fatalf("%+v: %v", good, err)
	}
	for name, mutate := range map[string]func(*RootConfig){
		"no layer":          func(r *RootConfig) { r.LowerDirs = nil },
		"too many layers":   func(r *RootConfig) { r.LowerDirs = make([]string, MaxLowerDirs+1) },
		"relative layer":    func(r *RootConfig) { r.LowerDirs = []string{"l"} },
		"unclean layer":     func(r *RootConfig) { r.LowerDirs = []string{"/l/../x"} },
		"upper escapes":     func(r *RootConfig) { r.UpperDir = "../x" },
		"upper unclean":     func(r *RootConfig) { r.UpperDir = "a/../../x" },
		"work missing":      func(r *RootConfig) { r.WorkDir = "" },
		"image with a line": func(r *RootConfig) { r.Image = "a\nb" },
	} {
		r := good
		r.LowerDirs = slices.Clone(good.LowerDirs)
		mutate(&r)
		if err := r.Validate(); err == nil {
			t.Errorf("%s: %+v passed", name, r)
		}
	}
}
