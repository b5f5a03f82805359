// Package api_test checks the BashTask CRD as the real API server applies it:
// CEL rules, bounds, defaults, field selectors and the status subresource.
package api_test

import (
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/bashtask/bashtask-operator/api/v1alpha1"
	"github.com/bashtask/bashtask-operator/internal/rig/testenv"
)

var env *testenv.Env

func TestMain(m *testing.M) {
	var err error
	env, err = testenv.Start()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	code := m.Run()
	if err := env.Stop(); err != nil {
		fmt.Fprintln(os.Stderr, "stopping the control plane:", err)
	}
	os.Exit(code)
}

// newNamespace creates a namespace of its own for one test.
func newNamespace(t *testing.T) string {
	t.Helper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "api-"}}
	if err := env.Client.Create(t.Context(), ns); err != nil {
		t.Fatalf("creating namespace: %v", err)
	}
	return ns.Name
}

// task builds a minimal valid BashTask and applies the given mutations.
func task(ns, name string, mutate ...func(*v1.BashTask)) *v1.BashTask {
	bt := &v1.BashTask{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec:       v1.BashTaskSpec{Command: "echo hello"},
	}
	for _, m := range mutate {
		m(bt)
	}
	return bt
}

func secretRef(name, key string) *v1.ValueSource {
	return &v1.ValueSource{SecretKeyRef: &v1.KeySelector{Name: name, Key: key}}
}

// wantInvalid asserts that err is an Invalid error whose message contains want.
func wantInvalid(t *testing.T, err error, want string) {
	t.Helper()
	if err == nil {
		t.Fatalf("request accepted; want rejection with %q", want)
	}
	if !apierrors.IsInvalid(err) {
		t.Fatalf("error is not Invalid (422): %v", err)
	}
	if !strings.Contains(err.Error(), want) {
		t.Fatalf("error does not contain %q:\n%v", want, err)
	}
}

func TestCreateValidation(t *testing.T) {
	ns := newNamespace(t)
	manyEnv := make([]v1.EnvVar, v1.MaxEnvEntries+1)
	for i := range manyEnv {
		manyEnv[i] = v1.EnvVar{Name: fmt.Sprintf("V%d", i), Value: ptr.To("x")}
	}
	tests := map[string]struct {
		mutate  func(*v1.BashTask)
		wantErr string // empty: accepted
	}{
		"minimal task": {
			mutate: func(*v1.BashTask) {},
		},
		"every field set": {
			mutate: func(bt *v1.BashTask) {
				bt.Spec.Stdin = ptr.To("input")
				bt.Spec.Env = []v1.EnvVar{
					{Name: "A", Value: ptr.To("1")},
					{Name: "B", ValueFrom: secretRef("s", "k")},
					{Name: "C", ValueFrom: &v1.ValueSource{ConfigMapKeyRef: &v1.KeySelector{Name: "cm", Key: "k.txt"}}},
				}
				bt.Spec.Owner = ptr.To("session-1")
				bt.Spec.WorkingDir = ptr.To("/tmp")
				bt.Spec.TimeoutSeconds = ptr.To[int32](5)
				bt.Spec.KillGracePeriodSeconds = ptr.To[int32](0)
				bt.Spec.Output = &v1.OutputSpec{TailBytes: ptr.To[int32](10), SpillLimitBytes: ptr.To[int64](100), Upload: ptr.To(v1.UploadAlways)}
				bt.Spec.NodeName = ptr.To("node-a")
				bt.Spec.NodeSelector = map[string]string{"kubernetes.io/os": "linux"}
				mem, cpu := resource.MustParse("64Mi"), resource.MustParse("500m")
				bt.Spec.Resources = &v1.ResourceLimits{Memory: &mem, CPU: &cpu, PIDs: ptr.To[int64](100), EphemeralStorage: ptr.To(resource.MustParse("1Gi"))}
				bt.Spec.Suspend = ptr.To(true)
				bt.Spec.TTLSecondsAfterFinished = ptr.To[int32](60)
			},
		},
		"command of exactly 131071 bytes": {
			mutate: func(bt *v1.BashTask) { bt.Spec.Command = strings.Repeat("a", v1.MaxCommandBytes) },
		},
		"empty command": {
			mutate:  func(bt *v1.BashTask) { bt.Spec.Command = "" },
			wantErr: "spec.command",
		},
		"command over 131071 characters": {
			mutate:  func(bt *v1.BashTask) { bt.Spec.Command = strings.Repeat("a", v1.MaxCommandBytes+1) },
			wantErr: "spec.command: Too long",
		},
		// 50000 euro signs are 50000 characters but 150000 bytes: only the
		// byte rule catches it, and the kernel counts bytes.
		"command over 131071 bytes in fewer characters": {
			mutate:  func(bt *v1.BashTask) { bt.Spec.Command = strings.Repeat("€", 50000) },
			wantErr: "command must be at most 131071 bytes (the kernel's per-argument limit)",
		},
		"command with a NUL byte": {
			mutate:  func(bt *v1.BashTask) { bt.Spec.Command = "echo a\x00b" },
			wantErr: "command must not contain a NUL byte",
		},
		"empty stdin is allowed": {
			mutate: func(bt *v1.BashTask) { bt.Spec.Stdin = ptr.To("") },
		},
		"stdin over 262144 bytes": {
			mutate:  func(bt *v1.BashTask) { bt.Spec.Stdin = ptr.To(strings.Repeat("é", v1.MaxStdinBytes/2+1)) },
			wantErr: "stdin must be at most 262144 bytes",
		},
		"stdin and stdinFrom together": {
			mutate: func(bt *v1.BashTask) {
				bt.Spec.Stdin = ptr.To("x")
				bt.Spec.StdinFrom = secretRef("s", "k")
			},
			wantErr: "stdin and stdinFrom are mutually exclusive",
		},
		"stdinStream alone": {
			mutate: func(bt *v1.BashTask) { bt.Spec.StdinStream = &v1.StdinStream{IdleTimeoutSeconds: ptr.To[int32](5)} },
		},
		"stdinStream with stdin": {
			mutate: func(bt *v1.BashTask) {
				bt.Spec.Stdin = ptr.To("x")
				bt.Spec.StdinStream = &v1.StdinStream{}
			},
			wantErr: "stdinStream is exclusive with stdin and stdinFrom",
		},
		"tty alone": {
			mutate: func(bt *v1.BashTask) { bt.Spec.TTY = ptr.To(true) },
		},
		"tty false with stdin": {
			mutate: func(bt *v1.BashTask) { bt.Spec.TTY, bt.Spec.Stdin = ptr.To(false), ptr.To("x") },
		},
		"tty with stdin": {
			mutate:  func(bt *v1.BashTask) { bt.Spec.TTY, bt.Spec.Stdin = ptr.To(true), ptr.To("x") },
			wantErr: "spec.tty is exclusive with spec.stdin, spec.stdinFrom and spec.stdinStream",
		},
		"tty with stdinFrom": {
			mutate:  func(bt *v1.BashTask) { bt.Spec.TTY, bt.Spec.StdinFrom = ptr.To(true), secretRef("s", "k") },
			wantErr: "spec.tty is exclusive with spec.stdin, spec.stdinFrom and spec.stdinStream",
		},
		"tty with stdinStream": {
			mutate:  func(bt *v1.BashTask) { bt.Spec.TTY, bt.Spec.StdinStream = ptr.To(true), &v1.StdinStream{} },
			wantErr: "spec.tty is exclusive with spec.stdin, spec.stdinFrom and spec.stdinStream",
		},
		"stdinStream with stdinFrom": {
			mutate: func(bt *v1.BashTask) {
				bt.Spec.StdinFrom = secretRef("s", "k")
				bt.Spec.StdinStream = &v1.StdinStream{}
			},
			wantErr: "stdinStream is exclusive with stdin and stdinFrom",
		},
		"stdinStream idle timeout 0": {
			mutate:  func(bt *v1.BashTask) { bt.Spec.StdinStream = &v1.StdinStream{IdleTimeoutSeconds: ptr.To[int32](0)} },
			wantErr: "spec.stdinStream.idleTimeoutSeconds: Invalid value: 0",
		},
		"stdinStream idle timeout over a day": {
			mutate:  func(bt *v1.BashTask) { bt.Spec.StdinStream = &v1.StdinStream{IdleTimeoutSeconds: ptr.To[int32](86401)} },
			wantErr: "spec.stdinStream.idleTimeoutSeconds: Invalid value: 86401",
		},
		"stdinFrom alone": {
			mutate: func(bt *v1.BashTask) { bt.Spec.StdinFrom = secretRef("s", "k") },
		},
		"stdinFrom with both references": {
			mutate: func(bt *v1.BashTask) {
				bt.Spec.StdinFrom = &v1.ValueSource{
					SecretKeyRef:    &v1.KeySelector{Name: "s", Key: "k"},
					ConfigMapKeyRef: &v1.KeySelector{Name: "c", Key: "k"},
				}
			},
			wantErr: "set exactly one of secretKeyRef and configMapKeyRef",
		},
		"env entry with value and valueFrom": {
			mutate: func(bt *v1.BashTask) {
				bt.Spec.Env = []v1.EnvVar{{Name: "A", Value: ptr.To("1"), ValueFrom: secretRef("s", "k")}}
			},
			wantErr: "an env entry must set exactly one of value and valueFrom",
		},
		"env entry with neither value nor valueFrom": {
			mutate:  func(bt *v1.BashTask) { bt.Spec.Env = []v1.EnvVar{{Name: "A"}} },
			wantErr: "an env entry must set exactly one of value and valueFrom",
		},
		"env entry with an empty value": {
			mutate: func(bt *v1.BashTask) { bt.Spec.Env = []v1.EnvVar{{Name: "A", Value: ptr.To("")}} },
		},
		"credential-looking env name is allowed": {
			mutate: func(bt *v1.BashTask) { bt.Spec.Env = []v1.EnvVar{{Name: "GITHUB_TOKEN", Value: ptr.To("x")}} },
		},
		"env name empty": {
			mutate:  func(bt *v1.BashTask) { bt.Spec.Env = []v1.EnvVar{{Name: "", Value: ptr.To("1")}} },
			wantErr: "spec.env[0].name",
		},
		"env name with =": {
			mutate:  func(bt *v1.BashTask) { bt.Spec.Env = []v1.EnvVar{{Name: "A=B", Value: ptr.To("1")}} },
			wantErr: "env name must not contain '='",
		},
		"env name with NUL": {
			mutate:  func(bt *v1.BashTask) { bt.Spec.Env = []v1.EnvVar{{Name: "A\x00", Value: ptr.To("1")}} },
			wantErr: "env name must not contain a NUL byte",
		},
		"env value with NUL": {
			mutate:  func(bt *v1.BashTask) { bt.Spec.Env = []v1.EnvVar{{Name: "A", Value: ptr.To("x\x00y")}} },
			wantErr: "spec.env[0].value: Invalid value",
		},
		"env duplicate names": {
			mutate: func(bt *v1.BashTask) {
				bt.Spec.Env = []v1.EnvVar{{Name: "A", Value: ptr.To("1")}, {Name: "A", Value: ptr.To("2")}}
			},
			wantErr: "Duplicate value",
		},
		"257 env entries": {
			mutate:  func(bt *v1.BashTask) { bt.Spec.Env = manyEnv },
			wantErr: "spec.env: Too many",
		},
		"secret key with a slash": {
			mutate:  func(bt *v1.BashTask) { bt.Spec.Env = []v1.EnvVar{{Name: "A", ValueFrom: secretRef("s", "a/b")}} },
			wantErr: "spec.env[0].valueFrom.secretKeyRef.key",
		},
		"relative workingDir": {
			mutate:  func(bt *v1.BashTask) { bt.Spec.WorkingDir = ptr.To("tmp/work") },
			wantErr: "workingDir must be an absolute path",
		},
		"timeout zero": {
			mutate:  func(bt *v1.BashTask) { bt.Spec.TimeoutSeconds = ptr.To[int32](0) },
			wantErr: "spec.timeoutSeconds",
		},
		"timeout over a week": {
			mutate:  func(bt *v1.BashTask) { bt.Spec.TimeoutSeconds = ptr.To[int32](v1.MaxTimeoutSeconds + 1) },
			wantErr: "spec.timeoutSeconds: Invalid value: 604801",
		},
		"timeout of 100 ms, grace of 200 ms": {
			mutate: func(bt *v1.BashTask) {
				bt.Spec.TimeoutMilliseconds = ptr.To[int32](100)
				bt.Spec.KillGracePeriodMilliseconds = ptr.To[int32](200)
			},
		},
		"timeout of a week in milliseconds, no grace": {
			mutate: func(bt *v1.BashTask) {
				bt.Spec.TimeoutMilliseconds = ptr.To[int32](v1.MaxTimeoutMilliseconds)
				bt.Spec.KillGracePeriodMilliseconds = ptr.To[int32](0)
			},
		},
		"timeoutMilliseconds zero": {
			mutate:  func(bt *v1.BashTask) { bt.Spec.TimeoutMilliseconds = ptr.To[int32](0) },
			wantErr: "spec.timeoutMilliseconds: Invalid value: 0",
		},
		"timeoutMilliseconds over a week": {
			mutate:  func(bt *v1.BashTask) { bt.Spec.TimeoutMilliseconds = ptr.To[int32](v1.MaxTimeoutMilliseconds + 1) },
			wantErr: "spec.timeoutMilliseconds: Invalid value: 604800001",
		},
		"timeoutSeconds and timeoutMilliseconds": {
			mutate: func(bt *v1.BashTask) {
				bt.Spec.TimeoutSeconds = ptr.To[int32](1)
				bt.Spec.TimeoutMilliseconds = ptr.To[int32](500)
			},
			wantErr: "timeoutSeconds and timeoutMilliseconds are mutually exclusive: set at most one",
		},
		"killGracePeriodMilliseconds negative": {
			mutate:  func(bt *v1.BashTask) { bt.Spec.KillGracePeriodMilliseconds = ptr.To[int32](-1) },
			wantErr: "spec.killGracePeriodMilliseconds: Invalid value: -1",
		},
		"killGracePeriodMilliseconds over 5 minutes": {
			mutate: func(bt *v1.BashTask) {
				bt.Spec.KillGracePeriodMilliseconds = ptr.To[int32](v1.MaxKillGracePeriodMilliseconds + 1)
			},
			wantErr: "spec.killGracePeriodMilliseconds: Invalid value: 300001",
		},
		"killGracePeriodSeconds and killGracePeriodMilliseconds": {
			mutate: func(bt *v1.BashTask) {
				bt.Spec.KillGracePeriodSeconds = ptr.To[int32](0)
				bt.Spec.KillGracePeriodMilliseconds = ptr.To[int32](200)
			},
			wantErr: "killGracePeriodSeconds and killGracePeriodMilliseconds are mutually exclusive: set at most one",
		},
		"tailBytes over 262144": {
			mutate:  func(bt *v1.BashTask) { bt.Spec.Output = &v1.OutputSpec{TailBytes: ptr.To[int32](v1.MaxTailBytes + 1)} },
			wantErr: "spec.output.tailBytes",
		},
		"unknown network": {
			mutate:  func(bt *v1.BashTask) { bt.Spec.Network = ptr.To[v1.TaskNetwork]("Host") },
			wantErr: "spec.network: Unsupported value",
		},
		"network Egress": {
			mutate: func(bt *v1.BashTask) { bt.Spec.Network = ptr.To(v1.NetworkEgress) },
		},
		"network egress in lower case": {
			mutate:  func(bt *v1.BashTask) { bt.Spec.Network = ptr.To[v1.TaskNetwork]("egress") },
			wantErr: "spec.network: Unsupported value",
		},
		"unknown upload policy": {
			mutate:  func(bt *v1.BashTask) { bt.Spec.Output = &v1.OutputSpec{Upload: ptr.To[v1.UploadPolicy]("Sometimes")} },
			wantErr: "spec.output.upload: Unsupported value",
		},
		"zero memory limit": {
			mutate: func(bt *v1.BashTask) {
				zero := resource.MustParse("0")
				bt.Spec.Resources = &v1.ResourceLimits{Memory: &zero}
			},
			wantErr: "resources.memory must be greater than zero",
		},
		"pids over PID_MAX_LIMIT": {
			mutate:  func(bt *v1.BashTask) { bt.Spec.Resources = &v1.ResourceLimits{PIDs: ptr.To[int64](4194305)} },
			wantErr: "spec.resources.pids",
		},
		"ephemeralStorage below the smallest file system": {
			mutate: func(bt *v1.BashTask) {
				bt.Spec.Resources = &v1.ResourceLimits{EphemeralStorage: ptr.To(resource.MustParse("31Mi"))}
			},
			wantErr: "resources.ephemeralStorage must be at least 32Mi",
		},
		"ephemeralStorage over 16Ti": {
			mutate: func(bt *v1.BashTask) {
				bt.Spec.Resources = &v1.ResourceLimits{EphemeralStorage: ptr.To(resource.MustParse("17Ti"))}
			},
			wantErr: "resources.ephemeralStorage must be at most 16Ti",
		},
		"ephemeralStorage of 2Gi": {
			mutate: func(bt *v1.BashTask) {
				bt.Spec.Resources = &v1.ResourceLimits{EphemeralStorage: ptr.To(resource.MustParse("2Gi"))}
			},
		},
	}
	i := 0
	for name, tc := range tests {
		i++
		t.Run(name, func(t *testing.T) {
			bt := task(ns, fmt.Sprintf("t%d", i), tc.mutate)
			err := env.Client.Create(t.Context(), bt)
			if tc.wantErr == "" {
				if err != nil {
					t.Fatalf("valid task rejected: %v", err)
				}
				return
			}
			wantInvalid(t, err, tc.wantErr)
		})
	}
}

func TestDefaults(t *testing.T) {
	ns := newNamespace(t)
	bt := task(ns, "defaults")
	if err := env.Client.Create(t.Context(), bt); err != nil {
		t.Fatal(err)
	}
	got := &v1.BashTask{}
	if err := env.Client.Get(t.Context(), client.ObjectKeyFromObject(bt), got); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"bashtask.dev/finalizer"}, got.Finalizers); diff != "" {
		t.Errorf("finalizers added by the admission policy (-want +got):\n%s", diff)
	}
	// No field is defaulted in the schema: the timeout and the grace
	// period each have two exclusive fields, and a default in one would
	// refuse the other (docs/api.md, "Defaults").
	want := v1.BashTaskSpec{Command: "echo hello"}
	if diff := cmp.Diff(want, got.Spec); diff != "" {
		t.Errorf("spec after defaulting (-want +got):\n%s", diff)
	}
}

// spec.stdinStream: {} gets the default idle timeout of 60 seconds.
func TestStdinStreamDefault(t *testing.T) {
	ns := newNamespace(t)
	bt := task(ns, "streamed")
	bt.Spec.StdinStream = &v1.StdinStream{}
	if err := env.Client.Create(t.Context(), bt); err != nil {
		t.Fatal(err)
	}
	got := &v1.BashTask{}
	if err := env.Client.Get(t.Context(), client.ObjectKeyFromObject(bt), got); err != nil {
		t.Fatal(err)
	}
	if s := got.Spec.StdinStream; s == nil || ptr.Deref(s.IdleTimeoutSeconds, 0) != v1.DefaultStdinIdleTimeoutSeconds {
		t.Fatalf("spec.stdinStream after defaulting: %+v, want idleTimeoutSeconds %d", s, v1.DefaultStdinIdleTimeoutSeconds)
	}
}

func TestUpdateValidation(t *testing.T) {
	ns := newNamespace(t)
	base := func(bt *v1.BashTask) {
		bt.Spec.Owner = ptr.To("alice")
		bt.Spec.Env = []v1.EnvVar{{Name: "A", Value: ptr.To("1")}}
	}
	tests := map[string]struct {
		initial func(*v1.BashTask)
		update  func(*v1.BashTask)
		wantErr string
	}{
		"command changed":          {update: func(bt *v1.BashTask) { bt.Spec.Command = "echo other" }, wantErr: "spec.command is immutable"},
		"env value changed":        {update: func(bt *v1.BashTask) { bt.Spec.Env[0].Value = ptr.To("2") }, wantErr: "spec.env is immutable"},
		"owner changed":            {update: func(bt *v1.BashTask) { bt.Spec.Owner = ptr.To("bob") }, wantErr: "spec.owner is immutable"},
		"owner removed":            {update: func(bt *v1.BashTask) { bt.Spec.Owner = nil }, wantErr: "spec.owner is immutable (it cannot be added or removed)"},
		"stdinStream added":        {update: func(bt *v1.BashTask) { bt.Spec.StdinStream = &v1.StdinStream{} }, wantErr: "spec.stdinStream is immutable (it cannot be added or removed)"},
		"stdinStream removed":      {initial: func(bt *v1.BashTask) { bt.Spec.StdinStream = &v1.StdinStream{} }, update: func(bt *v1.BashTask) { bt.Spec.StdinStream = nil }, wantErr: "spec.stdinStream is immutable (it cannot be added or removed)"},
		"stdinStream changed":      {initial: func(bt *v1.BashTask) { bt.Spec.StdinStream = &v1.StdinStream{} }, update: func(bt *v1.BashTask) { bt.Spec.StdinStream.IdleTimeoutSeconds = ptr.To[int32](9) }, wantErr: "spec.stdinStream is immutable"},
		"tty added":                {update: func(bt *v1.BashTask) { bt.Spec.TTY = ptr.To(true) }, wantErr: "spec.tty is immutable (it cannot be added or removed)"},
		"tty changed":              {initial: func(bt *v1.BashTask) { bt.Spec.TTY = ptr.To(true) }, update: func(bt *v1.BashTask) { bt.Spec.TTY = ptr.To(false) }, wantErr: "spec.tty is immutable"},
		"tty removed":              {initial: func(bt *v1.BashTask) { bt.Spec.TTY = ptr.To(true) }, update: func(bt *v1.BashTask) { bt.Spec.TTY = nil }, wantErr: "spec.tty is immutable (it cannot be added or removed)"},
		"stdin added":              {update: func(bt *v1.BashTask) { bt.Spec.Stdin = ptr.To("x") }, wantErr: "spec.stdin is immutable (it cannot be added or removed)"},
		"nodeName added":           {update: func(bt *v1.BashTask) { bt.Spec.NodeName = ptr.To("n") }, wantErr: "spec.nodeName is immutable (it cannot be added or removed)"},
		"timeout changed":          {initial: func(bt *v1.BashTask) { bt.Spec.TimeoutSeconds = ptr.To[int32](5) }, update: func(bt *v1.BashTask) { bt.Spec.TimeoutSeconds = ptr.To[int32](7) }, wantErr: "spec.timeoutSeconds is immutable"},
		"timeout added":            {update: func(bt *v1.BashTask) { bt.Spec.TimeoutSeconds = ptr.To[int32](7) }, wantErr: "spec.timeoutSeconds is immutable (it cannot be added or removed)"},
		"timeout in ms changed":    {initial: func(bt *v1.BashTask) { bt.Spec.TimeoutMilliseconds = ptr.To[int32](100) }, update: func(bt *v1.BashTask) { bt.Spec.TimeoutMilliseconds = ptr.To[int32](200) }, wantErr: "spec.timeoutMilliseconds is immutable"},
		"timeout in ms added":      {update: func(bt *v1.BashTask) { bt.Spec.TimeoutMilliseconds = ptr.To[int32](100) }, wantErr: "spec.timeoutMilliseconds is immutable (it cannot be added or removed)"},
		"timeout in ms removed":    {initial: func(bt *v1.BashTask) { bt.Spec.TimeoutMilliseconds = ptr.To[int32](100) }, update: func(bt *v1.BashTask) { bt.Spec.TimeoutMilliseconds = nil }, wantErr: "spec.timeoutMilliseconds is immutable (it cannot be added or removed)"},
		"grace in ms changed":      {initial: func(bt *v1.BashTask) { bt.Spec.KillGracePeriodMilliseconds = ptr.To[int32](100) }, update: func(bt *v1.BashTask) { bt.Spec.KillGracePeriodMilliseconds = ptr.To[int32](0) }, wantErr: "spec.killGracePeriodMilliseconds is immutable"},
		"grace in ms added":        {update: func(bt *v1.BashTask) { bt.Spec.KillGracePeriodMilliseconds = ptr.To[int32](100) }, wantErr: "spec.killGracePeriodMilliseconds is immutable (it cannot be added or removed)"},
		"grace in ms removed":      {initial: func(bt *v1.BashTask) { bt.Spec.KillGracePeriodMilliseconds = ptr.To[int32](100) }, update: func(bt *v1.BashTask) { bt.Spec.KillGracePeriodMilliseconds = nil }, wantErr: "spec.killGracePeriodMilliseconds is immutable (it cannot be added or removed)"},
		"network changed":          {initial: func(bt *v1.BashTask) { bt.Spec.Network = ptr.To(v1.NetworkNone) }, update: func(bt *v1.BashTask) { bt.Spec.Network = ptr.To(v1.NetworkNode) }, wantErr: "spec.network is immutable"},
		"network added":            {update: func(bt *v1.BashTask) { bt.Spec.Network = ptr.To(v1.NetworkNone) }, wantErr: "spec.network is immutable (it cannot be added or removed)"},
		"network removed":          {initial: func(bt *v1.BashTask) { bt.Spec.Network = ptr.To(v1.NetworkNone) }, update: func(bt *v1.BashTask) { bt.Spec.Network = nil }, wantErr: "spec.network is immutable (it cannot be added or removed)"},
		"cancelRequested set":      {update: func(bt *v1.BashTask) { bt.Spec.CancelRequested = ptr.To(true) }},
		"cancelRequested false":    {update: func(bt *v1.BashTask) { bt.Spec.CancelRequested = ptr.To(false) }},
		"suspend toggled":          {initial: func(bt *v1.BashTask) { bt.Spec.Suspend = ptr.To(true) }, update: func(bt *v1.BashTask) { bt.Spec.Suspend = ptr.To(false) }},
		"suspend removed":          {initial: func(bt *v1.BashTask) { bt.Spec.Suspend = ptr.To(true) }, update: func(bt *v1.BashTask) { bt.Spec.Suspend = nil }},
		"ttl added":                {update: func(bt *v1.BashTask) { bt.Spec.TTLSecondsAfterFinished = ptr.To[int32](5) }},
		"ttl changed":              {initial: func(bt *v1.BashTask) { bt.Spec.TTLSecondsAfterFinished = ptr.To[int32](5) }, update: func(bt *v1.BashTask) { bt.Spec.TTLSecondsAfterFinished = ptr.To[int32](9) }},
		"cancelRequested reverted": {initial: func(bt *v1.BashTask) { bt.Spec.CancelRequested = ptr.To(true) }, update: func(bt *v1.BashTask) { bt.Spec.CancelRequested = ptr.To(false) }, wantErr: "cancelRequested cannot be unset once it is true"},
		"cancelRequested removed":  {initial: func(bt *v1.BashTask) { bt.Spec.CancelRequested = ptr.To(true) }, update: func(bt *v1.BashTask) { bt.Spec.CancelRequested = nil }, wantErr: "cancelRequested cannot be unset once it is true"},
	}
	i := 0
	for name, tc := range tests {
		i++
		t.Run(name, func(t *testing.T) {
			bt := task(ns, fmt.Sprintf("u%d", i), base)
			if tc.initial != nil {
				tc.initial(bt)
			}
			if err := env.Client.Create(t.Context(), bt); err != nil {
				t.Fatalf("creating: %v", err)
			}
			tc.update(bt)
			err := env.Client.Update(t.Context(), bt)
			if tc.wantErr == "" {
				if err != nil {
					t.Fatalf("valid update rejected: %v", err)
				}
				return
			}
			wantInvalid(t, err, tc.wantErr)
			if strings.Contains(tc.wantErr, "is immutable") {
				wantHowToRunAgain(t, err)
			}
		})
	}
}

// wantHowToRunAgain asserts that an immutability error says how to run a
// new command: a new name, and how Argo CD and Flux replace a task.
func wantHowToRunAgain(t *testing.T, err error) {
	t.Helper()
	for _, want := range []string{"create a task with a new name", "Force=true,Replace=true", "BeforeHookCreation", "kustomize.toolkit.fluxcd.io/force: enabled"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error does not say %q:\n%v", want, err)
		}
	}
}

func TestFieldSelectors(t *testing.T) {
	ns := newNamespace(t)
	ctx := t.Context()
	for _, o := range []struct {
		name  string
		owner *string
	}{{"a1", ptr.To("alice")}, {"a2", ptr.To("alice")}, {"b1", ptr.To("bob")}, {"none", nil}} {
		bt := task(ns, o.name, func(bt *v1.BashTask) { bt.Spec.Owner = o.owner })
		if err := env.Client.Create(ctx, bt); err != nil {
			t.Fatal(err)
		}
	}
	// Mark one task Running through the status subresource, so the phase
	// selector has something to tell apart.
	running := &v1.BashTask{}
	if err := env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "a2"}, running); err != nil {
		t.Fatal(err)
	}
	running.Status.Phase = ptr.To(v1.PhaseRunning)
	if err := env.Client.Status().Update(ctx, running); err != nil {
		t.Fatal(err)
	}

	tests := map[string]struct {
		selector fields.Selector
		want     []string
	}{
		"owner alice":        {fields.OneTermEqualSelector("spec.owner", "alice"), []string{"a1", "a2"}},
		"owner bob":          {fields.OneTermEqualSelector("spec.owner", "bob"), []string{"b1"}},
		"owner not alice":    {fields.OneTermNotEqualSelector("spec.owner", "alice"), []string{"b1", "none"}},
		"phase Running":      {fields.OneTermEqualSelector("status.phase", "Running"), []string{"a2"}},
		"alice and Running":  {fields.AndSelectors(fields.OneTermEqualSelector("spec.owner", "alice"), fields.OneTermEqualSelector("status.phase", "Running")), []string{"a2"}},
		"owner with no task": {fields.OneTermEqualSelector("spec.owner", "carol"), nil},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			list := &v1.BashTaskList{}
			if err := env.Client.List(ctx, list, client.InNamespace(ns), client.MatchingFieldsSelector{Selector: tc.selector}); err != nil {
				t.Fatalf("listing with %s: %v", tc.selector, err)
			}
			var got []string
			for _, bt := range list.Items {
				got = append(got, bt.Name)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("tasks selected by %s (-want +got):\n%s", tc.selector, diff)
			}
		})
	}

	t.Run("unsupported field is refused", func(t *testing.T) {
		err := env.Client.List(ctx, &v1.BashTaskList{}, client.InNamespace(ns),
			client.MatchingFieldsSelector{Selector: fields.OneTermEqualSelector("spec.command", "x")})
		if !apierrors.IsBadRequest(err) {
			t.Fatalf("listing by spec.command: got %v, want a BadRequest", err)
		}
	})
}

func TestStatusSubresource(t *testing.T) {
	ns := newNamespace(t)
	ctx := t.Context()
	bt := task(ns, "status")
	if err := env.Client.Create(ctx, bt); err != nil {
		t.Fatal(err)
	}

	// A status change sent to the main resource is dropped by the server.
	bt.Status.Phase = ptr.To(v1.PhaseSucceeded)
	bt.Status.Reason = ptr.To(v1.ReasonSucceeded)
	if err := env.Client.Update(ctx, bt); err != nil {
		t.Fatalf("update through the main resource: %v", err)
	}
	got := &v1.BashTask{}
	if err := env.Client.Get(ctx, client.ObjectKeyFromObject(bt), got); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(v1.BashTaskStatus{}, got.Status); diff != "" {
		t.Fatalf("status written through the main resource (-want +got):\n%s", diff)
	}

	// The status subresource writes status and ignores spec changes.
	got.Status = v1.BashTaskStatus{
		Phase:    ptr.To(v1.PhaseSucceeded),
		Reason:   ptr.To(v1.ReasonSucceeded),
		ExitCode: ptr.To[int32](0),
		Stdout:   &v1.StreamStatus{Tail: ptr.To("hello\n"), TotalBytes: ptr.To[int64](6), SHA256: ptr.To(strings.Repeat("a", 64))},
	}
	got.Spec.Command = "echo changed through status"
	if err := env.Client.Status().Update(ctx, got); err != nil {
		t.Fatalf("update through the status subresource: %v", err)
	}
	after := &v1.BashTask{}
	if err := env.Client.Get(ctx, client.ObjectKeyFromObject(bt), after); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(got.Status, after.Status); diff != "" {
		t.Errorf("status after status update (-want +got):\n%s", diff)
	}
	if after.Spec.Command != "echo hello" {
		t.Errorf("spec.command changed through the status subresource to %q", after.Spec.Command)
	}
}
