package executor

import (
	"errors"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func envMap(t *testing.T, env []string) map[string]string {
	t.Helper()
	m := make(map[string]string, len(env))
	for _, kv := range env {
		name, value, ok := strings.Cut(kv, "=")
		if !ok {
			t.Fatalf("entry %q has no '='", kv)
		}
		if _, dup := m[name]; dup {
			t.Fatalf("name %q appears twice", name)
		}
		m[name] = value
	}
	return m
}

func TestBuildEnv(t *testing.T) {
	fixed := map[string]string{"NO_COLOR": "1", "TERM": "dumb", "PAGER": "cat", "GIT_PAGER": "cat"}
	with := func(extra map[string]string) map[string]string {
		m := map[string]string{}
		for k, v := range fixed {
			m[k] = v
		}
		for k, v := range extra {
			m[k] = v
		}
		return m
	}
	tests := []struct {
		name string
		opts EnvOptions
		want map[string]string
	}{
		{
			name: "scrub drops credentials, managed prefix and shell hooks",
			opts: EnvOptions{Ambient: []string{
				"MY_API_KEY=1", "db_password=2", "GH_TOKEN=3", "BASHTASK_STALE=4", "bashtask_lower=5",
				"AWS_SECRET_ACCESS_KEY=6", "BASH_ENV=/x", "ENV=/y", "SHELLOPTS=xtrace", "BASHOPTS=extglob",
				"BASH_FUNC_ls%%=() { :; }", "PLAIN=1", "PATH=/bin",
			}},
			want: with(map[string]string{"PLAIN": "1", "PATH": "/bin", "LANG": "C.UTF-8"}),
		},
		{
			name: "scrub drops the wider credential shapes, by name and by value",
			opts: EnvOptions{Ambient: []string{
				"AZURE_STORAGE_CONNECTION_STRING=DefaultEndpointsProtocol=https;AccountName=a;AccountKey=c2VjcmV0",
				"DATABASE_URL=postgres://app:hunter2@db:5432/app", "DB_PASSWD=p", "GITHUB_PAT=ghp_x", "PROXY_AUTH=u:p",
				"SMTP_PASS=p", "AWS_CREDENTIALS_FILE=/x", "QUEUE=Endpoint=sb://q/;SharedAccessKeyName=n;SharedAccessKey=k",
				"MIRROR=https://user:pw@mirror.example/", "APP_DSN=Server=s;Database=d;Password=p",
				"PATH=/bin", "OLDPWD=/root", "PWD=/", "HOMEPAGE_URL=https://example.com/a@b", "NO_PROXY=localhost", "PATTERN=x",
			}},
			want: with(map[string]string{"PATH": "/bin", "OLDPWD": "/root", "PWD": "/", "HOMEPAGE_URL": "https://example.com/a@b",
				"NO_PROXY": "localhost", "PATTERN": "x", "LANG": "C.UTF-8"}),
		},
		{
			name: "defaults come first: the ambient and the task replace them",
			opts: EnvOptions{Defaults: []EnvVar{{"PATH", DefaultTaskPath}, {"A", "default"}}, Ambient: []string{"A=ambient"}},
			want: with(map[string]string{"PATH": DefaultTaskPath, "A": "ambient", "LANG": "C.UTF-8"}),
		},
		{
			name: "explicit entry wins even when it looks like a credential",
			opts: EnvOptions{Ambient: []string{"GITHUB_TOKEN=agent"}, Explicit: []EnvVar{{"GITHUB_TOKEN", "x"}}},
			want: with(map[string]string{"GITHUB_TOKEN": "x", "LANG": "C.UTF-8"}),
		},
		{
			name: "managed entries win over explicit ones",
			opts: EnvOptions{Explicit: []EnvVar{{"BASHTASK_NAME", "spoof"}}, Managed: []EnvVar{{"BASHTASK_NAME", "real"}}},
			want: with(map[string]string{"BASHTASK_NAME": "real", "LANG": "C.UTF-8"}),
		},
		{
			name: "identity replaces the agent's HOME, explicit HOME wins over the identity",
			opts: EnvOptions{Ambient: []string{"HOME=/root", "USER=root"}, Identity: []EnvVar{{"HOME", "/home/task"}, {"USER", "task"}}, Explicit: []EnvVar{{"HOME", "/w"}}},
			want: with(map[string]string{"HOME": "/w", "USER": "task", "LANG": "C.UTF-8"}),
		},
		{
			name: "explicit entry overrides terminal settings",
			opts: EnvOptions{Explicit: []EnvVar{{"TERM", "xterm"}}},
			want: with(map[string]string{"TERM": "xterm", "LANG": "C.UTF-8"}),
		},
		{
			name: "LANG default only when neither LANG nor LC_ALL is set",
			opts: EnvOptions{Ambient: []string{"LC_ALL=de_DE.UTF-8"}},
			want: with(map[string]string{"LC_ALL": "de_DE.UTF-8"}),
		},
		{
			name: "ambient LANG is kept",
			opts: EnvOptions{Ambient: []string{"LANG=fr_FR.UTF-8"}},
			want: with(map[string]string{"LANG": "fr_FR.UTF-8"}),
		},
		{
			name: "allowlist passes only listed names, credentials included",
			opts: EnvOptions{Mode: AmbientAllowlist, Allowlist: []string{"PATH", "GH_TOKEN"}, Ambient: []string{"PATH=/bin", "GH_TOKEN=t", "HOME=/root"}},
			want: with(map[string]string{"PATH": "/bin", "GH_TOKEN": "t", "LANG": "C.UTF-8"}),
		},
		{
			name: "inherit passes everything",
			opts: EnvOptions{Mode: AmbientInherit, Ambient: []string{"GH_TOKEN=t", "BASH_ENV=/x"}},
			want: with(map[string]string{"GH_TOKEN": "t", "BASH_ENV": "/x", "LANG": "C.UTF-8"}),
		},
		{
			name: "malformed ambient entries are ignored, later duplicates win",
			opts: EnvOptions{Ambient: []string{"NOEQUALS", "=value", "A=1", "A=2"}},
			want: with(map[string]string{"A": "2", "LANG": "C.UTF-8"}),
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			env, err := BuildEnv(tc.opts)
			if err != nil {
				t.Fatalf("BuildEnv: %v", err)
			}
			if diff := cmp.Diff(tc.want, envMap(t, env)); diff != "" {
				t.Errorf("environment (-want +got):\n%s", diff)
			}
		})
	}
}

func TestBuildEnvRejectsInvalidEntries(t *testing.T) {
	tests := []struct {
		name string
		v    EnvVar
		want error
	}{
		{"empty name", EnvVar{"", "x"}, ErrEnvNameEmpty},
		{"equals in name", EnvVar{"A=B", "x"}, ErrEnvNameEquals},
		{"NUL in name", EnvVar{"A\x00B", "x"}, ErrEnvNUL},
		{"NUL in value", EnvVar{"A", "x\x00y"}, ErrEnvNUL},
		{"entry over the kernel's per-string limit", EnvVar{"A", strings.Repeat("x", MaxArgStrlen-2)}, ErrArgumentTooLong},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			for _, opts := range []EnvOptions{{Explicit: []EnvVar{tc.v}}, {Managed: []EnvVar{tc.v}}} {
				_, err := BuildEnv(opts)
				if !errors.Is(err, tc.want) {
					t.Fatalf("BuildEnv error = %v, want %v", err, tc.want)
				}
				var se *StartError
				if !errors.As(err, &se) {
					t.Fatalf("error %v is not a *StartError", err)
				}
			}
		})
	}
	// The longest entry the kernel takes: NAME=VALUE plus NUL is exactly
	// MaxArgStrlen.
	if _, err := BuildEnv(EnvOptions{Explicit: []EnvVar{{"A", strings.Repeat("x", MaxArgStrlen-3)}}}); err != nil {
		t.Fatalf("entry of MaxArgStrlen-1 bytes rejected: %v", err)
	}
}

// FuzzBuildEnv checks the environment builder's invariants for arbitrary
// names and values: valid entries only, one per name, the LANG default,
// explicit over ambient, managed over everything, and no scrubbed ambient
// name leaking through.
func FuzzBuildEnv(f *testing.F) {
	f.Add("MY_API_KEY", "1", "PLAIN", "2", "BASHTASK_NAME", "spoof", "real", uint8(0))
	f.Add("LANG", "C", "LC_ALL", "x", "GITHUB_TOKEN", "x", "y", uint8(1))
	f.Add("BASH_FUNC_f%%", "() { :; }", "A=B", "v", "TERM", "xterm", "z", uint8(2))
	f.Fuzz(func(t *testing.T, ambName, ambValue, expName, expValue, manName, manValue, expOverride string, mode uint8) {
		modes := []AmbientMode{AmbientScrub, AmbientAllowlist, AmbientInherit}
		opts := EnvOptions{
			Mode:      modes[int(mode)%len(modes)],
			Allowlist: []string{ambName},
			Ambient:   []string{ambName + "=" + ambValue, "PLAIN=1"},
			Explicit:  []EnvVar{{expName, expValue}, {expName, expOverride}},
			Managed:   []EnvVar{{manName, manValue}},
		}
		env, err := BuildEnv(opts)
		invalid := ValidateEnvVar(EnvVar{expName, expValue}) != nil ||
			ValidateEnvVar(EnvVar{expName, expOverride}) != nil ||
			ValidateEnvVar(EnvVar{manName, manValue}) != nil
		if invalid {
			if err == nil {
				t.Fatalf("invalid entry accepted")
			}
			return
		}
		if err != nil {
			t.Fatalf("BuildEnv: %v", err)
		}
		m := envMap(t, env)
		for _, kv := range env {
			if strings.IndexByte(kv, 0) >= 0 {
				t.Fatalf("entry %q contains NUL", kv)
			}
		}
		if got := m[manName]; got != manValue {
			t.Fatalf("managed %s = %q, want %q", manName, got, manValue)
		}
		if expName != manName {
			if got := m[expName]; got != expOverride {
				t.Fatalf("explicit %s = %q, want the later entry %q", expName, got, expOverride)
			}
		}
		_, lang := m["LANG"]
		_, lcAll := m["LC_ALL"]
		if !lang && !lcAll {
			t.Fatalf("neither LANG nor LC_ALL set")
		}
		ambientOnly := ambName != expName && ambName != manName && !strings.Contains(ambName, "=") && ambName != "" &&
			ambName != "LANG" && ambName != "PLAIN" && !isTerminalName(ambName)
		if ambientOnly && strings.IndexByte(ambName+ambValue, 0) >= 0 {
			if _, present := m[ambName]; present {
				t.Fatalf("ambient entry with NUL passed")
			}
		} else if ambientOnly {
			v, present := m[ambName]
			switch {
			case opts.Mode == AmbientScrub && Scrubbed(ambName) && present:
				t.Fatalf("scrubbed name %q reached the environment", ambName)
			case opts.Mode == AmbientScrub && !Scrubbed(ambName) && v != ambValue:
				t.Fatalf("plain ambient %q = %q, want %q", ambName, v, ambValue)
			case opts.Mode != AmbientScrub && v != ambValue:
				t.Fatalf("%s mode: ambient %q = %q, want %q", opts.Mode, ambName, v, ambValue)
			}
		}
		if _, present := m["PLAIN"]; opts.Mode == AmbientAllowlist && ambName != "PLAIN" && present && expName != "PLAIN" && manName != "PLAIN" {
			t.Fatalf("allowlist mode passed an unlisted name")
		}
	})
}

func isTerminalName(name string) bool {
	for _, v := range terminalEnv {
		if v.Name == name {
			return true
		}
	}
	return false
}
