package plugin

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"k8s.io/cli-runtime/pkg/genericiooptions"
	"k8s.io/utils/ptr"

	bashtaskv1alpha1 "github.com/bashtask/bashtask-operator/api/v1alpha1"
)

func secretRef(secret, key string) bashtaskv1alpha1.EnvVar {
	return bashtaskv1alpha1.EnvVar{Name: key, ValueFrom: &bashtaskv1alpha1.ValueSource{
		SecretKeyRef: &bashtaskv1alpha1.KeySelector{Name: secret, Key: key},
	}}
}

func literal(name, value string) bashtaskv1alpha1.EnvVar {
	return bashtaskv1alpha1.EnvVar{Name: name, Value: ptr.To(value)}
}

func TestBuildTask(t *testing.T) {
	tests := map[string]struct {
		flags      runFlags
		timeoutSet bool
		args       []string
		stdin      *string
		keys       map[string][]string
		want       bashtaskv1alpha1.BashTaskSpec
		wantName   string
		wantErr    string
	}{
		"words joined": {
			args: []string{"ls", "-l", "$HOME"},
			want: bashtaskv1alpha1.BashTaskSpec{Command: "ls -l $HOME"},
		},
		"every flag": {
			flags:      runFlags{env: []string{"A=1", "B=x=y", "EMPTY="}, timeout: 90 * time.Second, owner: "s1", node: "n1", name: "job"},
			timeoutSet: true,
			args:       []string{"true"},
			stdin:      ptr.To(""),
			want: bashtaskv1alpha1.BashTaskSpec{Command: "true", Stdin: ptr.To(""), Owner: ptr.To("s1"), NodeName: ptr.To("n1"), TimeoutSeconds: ptr.To[int32](90),
				Env: []bashtaskv1alpha1.EnvVar{literal("A", "1"), literal("B", "x=y"), literal("EMPTY", "")}},
			wantName: "job",
		},
		"secrets: --env wins, then the later secret": {
			flags: runFlags{env: []string{"MODE=cli"}, envFromSecrets: []string{"s1", "s2"}},
			args:  []string{"env"},
			keys:  map[string][]string{"s1": {"A", "B", "MODE"}, "s2": {"B", "C"}},
			want: bashtaskv1alpha1.BashTaskSpec{Command: "env", Env: []bashtaskv1alpha1.EnvVar{
				literal("MODE", "cli"), secretRef("s1", "A"), secretRef("s2", "B"), secretRef("s2", "C"),
			}},
		},
		"timeout rounds up": {
			flags: runFlags{timeout: 1500 * time.Millisecond}, timeoutSet: true, args: []string{"true"},
			want: bashtaskv1alpha1.BashTaskSpec{Command: "true", TimeoutSeconds: ptr.To[int32](2)},
		},
		"--stream": {
			flags: runFlags{stdin: true, stream: true}, args: []string{"cat"},
			want: bashtaskv1alpha1.BashTaskSpec{Command: "cat", StdinStream: &bashtaskv1alpha1.StdinStream{}},
		},
		"--stream with an idle timeout": {
			flags: runFlags{stdin: true, stream: true, stdinIdle: 1500 * time.Millisecond}, args: []string{"cat"},
			want: bashtaskv1alpha1.BashTaskSpec{Command: "cat", StdinStream: &bashtaskv1alpha1.StdinStream{IdleTimeoutSeconds: ptr.To[int32](2)}},
		},
		"--stream without -i": {flags: runFlags{stream: true}, args: []string{"cat"}, wantErr: "--stream needs -i"},
		"idle without stream": {flags: runFlags{stdin: true, stdinIdle: time.Second}, args: []string{"cat"}, wantErr: "--stdin-idle-timeout needs --stream"},
		"idle over a day": {
			flags: runFlags{stdin: true, stream: true, stdinIdle: 25 * time.Hour}, args: []string{"cat"},
			wantErr: "spec.stdinStream.idleTimeoutSeconds must be 1 to 86400 seconds",
		},
		"no command":       {args: nil, wantErr: "spec.command: a command is required after --"},
		"blank command":    {args: []string{" "}, wantErr: "spec.command: a command is required"},
		"command too long": {args: []string{strings.Repeat("x", 131072)}, wantErr: "spec.command: 131072 bytes exceed the limit of 131071 bytes"},
		"env without =":    {flags: runFlags{env: []string{"A"}}, args: []string{"true"}, wantErr: `--env "A": want NAME=VALUE`},
		"env empty name":   {flags: runFlags{env: []string{"=1"}}, args: []string{"true"}, wantErr: "spec.env[].name must not be empty"},
		"env twice":        {flags: runFlags{env: []string{"A=1", "A=2"}}, args: []string{"true"}, wantErr: "--env A given twice"},
		"env name too long": {
			flags: runFlags{env: []string{strings.Repeat("N", 1025) + "=v"}}, args: []string{"true"},
			wantErr: "spec.env[].name is 1025 characters, over the limit of 1024",
		},
		"env value too long": {
			flags: runFlags{env: []string{"V=" + strings.Repeat("v", 131072)}}, args: []string{"true"},
			wantErr: "--env V: spec.env[].value is 131072 bytes, over the limit of 131071 bytes",
		},
		"too many env entries": {
			flags: runFlags{envFromSecrets: []string{"big"}}, args: []string{"true"},
			keys:    map[string][]string{"big": manyKeys(257)},
			wantErr: "spec.env: 257 entries (from --env and --env-from-secret) exceed the limit of 256",
		},
		"zero timeout":       {flags: runFlags{timeout: 0}, timeoutSet: true, args: []string{"true"}, wantErr: "spec.timeoutSeconds must be at least 1 second"},
		"timeout too long":   {flags: runFlags{timeout: 169 * time.Hour}, timeoutSet: true, args: []string{"true"}, wantErr: "spec.timeoutSeconds is at most 604800"},
		"owner too long":     {flags: runFlags{owner: strings.Repeat("o", 254)}, args: []string{"true"}, wantErr: "--owner: spec.owner is 254 characters, over the limit of 253"},
		"node name too long": {flags: runFlags{node: strings.Repeat("n", 254)}, args: []string{"true"}, wantErr: "--node: spec.nodeName is 254 characters"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			bt, err := buildTask("ns1", tc.flags, tc.timeoutSet, tc.args, tc.stdin, tc.keys)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error %v, want one containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, bt.Spec); diff != "" {
				t.Errorf("spec (-want +got):\n%s", diff)
			}
			wantGenerate := ""
			if tc.wantName == "" {
				wantGenerate = generateNamePrefix
			}
			if bt.Namespace != "ns1" || bt.Name != tc.wantName || bt.GenerateName != wantGenerate {
				t.Errorf("metadata %s/%s generateName %q; want ns1/%s generateName %q", bt.Namespace, bt.Name, bt.GenerateName, tc.wantName, wantGenerate)
			}
		})
	}
}

func manyKeys(n int) []string {
	keys := make([]string, n)
	for i := range keys {
		keys[i] = strings.Repeat("K", i+1)
	}
	return keys
}

func TestReadStdin(t *testing.T) {
	tests := map[string]struct {
		in      string
		wantErr string
	}{
		"empty":        {in: ""},
		"text":         {in: "héllo\n"},
		"at the limit": {in: strings.Repeat("x", bashtaskv1alpha1.MaxStdinBytes)},
		"over":         {in: strings.Repeat("x", bashtaskv1alpha1.MaxStdinBytes+1), wantErr: "stdin is more than 262144 bytes, the limit of spec.stdin"},
		"binary":       {in: "\xff\xfe", wantErr: "stdin is not valid UTF-8"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got, err := readStdin(strings.NewReader(tc.in))
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error %v, want one containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil || got != tc.in {
				t.Errorf("readStdin = %d bytes, %v; want the %d bytes given", len(got), err, len(tc.in))
			}
		})
	}
}

// TestMainArguments checks what is decided before the API server is
// contacted: the kubeconfig points nowhere, so reaching it would fail.
func TestMainArguments(t *testing.T) {
	tests := map[string]struct {
		args       []string
		wantCode   int
		wantStderr string
	}{
		"run without command":  {args: []string{"run"}, wantCode: ExitPluginError, wantStderr: "spec.command: a command is required"},
		"run with a bad --env": {args: []string{"run", "--env", "X", "--", "true"}, wantCode: ExitPluginError, wantStderr: `--env "X": want NAME=VALUE`},
		"run unknown flag":     {args: []string{"run", "--bogus", "--", "true"}, wantCode: ExitPluginError, wantStderr: "unknown flag: --bogus"},
		"wait needs a name":    {args: []string{"wait"}, wantCode: ExitPluginError, wantStderr: "accepts 1 arg(s)"},
		"wait negative":        {args: []string{"wait", "x", "--timeout", "-1s"}, wantCode: ExitPluginError, wantStderr: "--timeout -1s: must not be negative"},
		"logs needs a name":    {args: []string{"logs"}, wantCode: ExitFailure, wantStderr: "accepts 1 arg(s)"},
		"cancel needs a name":  {args: []string{"cancel"}, wantCode: ExitFailure, wantStderr: "requires at least 1 arg(s)"},
		"get names and owner":  {args: []string{"get", "a", "--owner", "o"}, wantCode: ExitFailure, wantStderr: "cannot be combined with names"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			var out, errOut bytes.Buffer
			args := append([]string{"--kubeconfig", "/nonexistent/kubeconfig"}, tc.args...)
			code := Main(t.Context(), Options{IOStreams: genericiooptions.IOStreams{In: strings.NewReader(""), Out: &out, ErrOut: &errOut}}, args)
			if code != tc.wantCode || !strings.Contains(errOut.String(), tc.wantStderr) || out.Len() != 0 {
				t.Errorf("exit %d, stdout %q, stderr %q; want exit %d and stderr containing %q", code, out.String(), errOut.String(), tc.wantCode, tc.wantStderr)
			}
		})
	}
}

func TestHelpDocumentsExitStatuses(t *testing.T) {
	for _, cmd := range []string{"run", "wait"} {
		var out bytes.Buffer
		code := Main(t.Context(), Options{IOStreams: genericiooptions.IOStreams{In: strings.NewReader(""), Out: &out, ErrOut: &out}}, []string{cmd, "--help"})
		if code != ExitOK || !strings.Contains(out.String(), "Exit status of run and wait") || !strings.Contains(out.String(), "124") {
			t.Errorf("%s --help: exit %d, output without the exit statuses:\n%s", cmd, code, out.String())
		}
	}
}
