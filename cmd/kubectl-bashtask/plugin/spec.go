package plugin

import (
	"errors"
	"fmt"
	"io"
	"math"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/google/go-containerregistry/pkg/name"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	bashtaskv1alpha1 "github.com/bashtask/bashtask-operator/api/v1alpha1"
)

// Limits the schema enforces that api/v1alpha1 has no constant for; they are
// checked here too so that a mistake is reported before anything is sent,
// naming the flag and the field.
const (
	maxEnvNameChars = 1024
	// maxNameChars is the schema's MaxLength of spec.owner and
	// spec.nodeName (a node name is a DNS subdomain).
	maxNameChars      = 253
	maxTimeoutSeconds = 604800
	// maxStdinIdleSeconds is the schema's Maximum of
	// spec.stdinStream.idleTimeoutSeconds (a day).
	maxStdinIdleSeconds = 86400
	generateNamePrefix  = "run-"
)

// runFlags are the flags of run that shape the task.
type runFlags struct {
	stdin          bool
	tty            bool          // -t: spec.tty, the local terminal attached
	stream         bool          // --stream: spec.stdinStream, fed live
	stdinIdle      time.Duration // --stdin-idle-timeout; 0: the API's default
	env            []string
	envFromSecrets []string
	timeout        time.Duration
	owner          string
	node           string
	workspace      string
	workingDir     string
	name           string
	rm             bool
	// ownerSet is true when --owner was given (with --workspace, the
	// workspace's owner is the default).
	ownerSet bool
	// waitTimeout bounds the whole wait (--wait-timeout); 0: none.
	waitTimeout time.Duration
	// detach creates the task and returns (--detach).
	detach bool
	// ttl is spec.ttlSecondsAfterFinished (--ttl); 0 leaves it unset (the
	// controller's default TTL).
	ttl time.Duration
	// image is spec.image (--image), imagePullSecrets
	// spec.imagePullSecrets (--image-pull-secret, repeatable).
	image            string
	imagePullSecrets []string
	// egress is --egress-allow and --egress-deny: spec.egress, with
	// network Egress.
	egress egressFlagValues
}

// commandFromArgs joins the words after `--` with spaces into the string
// given to `bash -c`, as ssh does with its command words: `run -- ls -l
// '$HOME'` runs `ls -l $HOME`, and a single quoted word is a whole script.
func commandFromArgs(args []string) (string, error) {
	cmd := strings.Join(args, " ")
	switch {
	case strings.TrimSpace(cmd) == "":
		return "", errors.New("spec.command: a command is required after --, as in: kubectl bashtask run -- uname -a")
	case len(cmd) > bashtaskv1alpha1.MaxCommandBytes:
		return "", fmt.Errorf("spec.command: %d bytes exceed the limit of %d bytes (the kernel's per-argument limit); pass a long script with -i on stdin, e.g. run -i -- bash < script.sh",
			len(cmd), bashtaskv1alpha1.MaxCommandBytes)
	}
	return cmd, nil
}

// parseEnv turns --env NAME=VALUE flags into env entries, in order.
func parseEnv(flags []string) ([]bashtaskv1alpha1.EnvVar, error) {
	var out []bashtaskv1alpha1.EnvVar
	seen := map[string]bool{}
	for _, f := range flags {
		name, value, ok := strings.Cut(f, "=")
		switch {
		case !ok:
			return nil, fmt.Errorf("--env %q: want NAME=VALUE", f)
		case name == "":
			return nil, fmt.Errorf("--env %q: spec.env[].name must not be empty", f)
		case len([]rune(name)) > maxEnvNameChars:
			return nil, fmt.Errorf("--env %.20q...: spec.env[].name is %d characters, over the limit of %d", name, len([]rune(name)), maxEnvNameChars)
		case len(value) > bashtaskv1alpha1.MaxEnvValueBytes:
			return nil, fmt.Errorf("--env %s: spec.env[].value is %d bytes, over the limit of %d bytes (the kernel's per-string limit)", name, len(value), bashtaskv1alpha1.MaxEnvValueBytes)
		case strings.ContainsRune(value, 0):
			return nil, fmt.Errorf("--env %s: spec.env[].value must not contain a NUL byte", name)
		case seen[name]:
			return nil, fmt.Errorf("--env %s given twice: spec.env names must be unique", name)
		}
		seen[name] = true
		out = append(out, bashtaskv1alpha1.EnvVar{Name: name, Value: ptr.To(value)})
	}
	return out, nil
}

// secretEnv lists one env entry per key of each Secret, each a reference the
// controller resolves, so the values never pass through this process. As in
// a container's envFrom, an explicit --env wins over a Secret's key and a
// later Secret over an earlier one. keys holds each Secret's keys, sorted.
func secretEnv(explicit []bashtaskv1alpha1.EnvVar, secrets []string, keys map[string][]string) []bashtaskv1alpha1.EnvVar {
	taken := map[string]bool{}
	for _, e := range explicit {
		taken[e.Name] = true
	}
	var out []bashtaskv1alpha1.EnvVar
	for i := len(secrets) - 1; i >= 0; i-- {
		var fromThis []bashtaskv1alpha1.EnvVar
		for _, k := range keys[secrets[i]] {
			if taken[k] {
				continue
			}
			taken[k] = true
			fromThis = append(fromThis, bashtaskv1alpha1.EnvVar{Name: k, ValueFrom: &bashtaskv1alpha1.ValueSource{
				SecretKeyRef: &bashtaskv1alpha1.KeySelector{Name: secrets[i], Key: k},
			}})
		}
		out = append(fromThis, out...)
	}
	return out
}

// timeoutSeconds converts --timeout to spec.timeoutSeconds, rounding up to
// whole seconds so the task never gets less time than asked for.
func timeoutSeconds(d time.Duration) (*int32, error) {
	if d <= 0 {
		return nil, fmt.Errorf("--timeout %s: spec.timeoutSeconds must be at least 1 second", d)
	}
	s := (d + time.Second - 1) / time.Second
	if s > maxTimeoutSeconds {
		return nil, fmt.Errorf("--timeout %s: spec.timeoutSeconds is at most %d (7 days)", d, maxTimeoutSeconds)
	}
	return ptr.To(int32(s)), nil
}

// readStdin reads the local standard input for -i whole. spec.stdin is a
// JSON string, so it must be UTF-8 text within the API's size limit.
func readStdin(r io.Reader) (string, error) {
	b, err := io.ReadAll(io.LimitReader(r, bashtaskv1alpha1.MaxStdinBytes+1))
	if err != nil {
		return "", fmt.Errorf("reading stdin for -i: %w", err)
	}
	if len(b) > bashtaskv1alpha1.MaxStdinBytes {
		return "", fmt.Errorf("-i: stdin is more than %d bytes, the limit of spec.stdin; store larger input in a Secret or ConfigMap and reference it with spec.stdinFrom",
			bashtaskv1alpha1.MaxStdinBytes)
	}
	if !utf8.Valid(b) {
		return "", errors.New("-i: stdin is not valid UTF-8: spec.stdin holds text only; encode binary input (base64) and decode it in the command")
	}
	return string(b), nil
}

// buildTask returns the task run creates. stdin is nil without -i;
// secretKeys holds the keys of each --env-from-secret Secret.
func buildTask(ns string, f runFlags, timeoutSet bool, args []string, stdin *string, secretKeys map[string][]string) (*bashtaskv1alpha1.BashTask, error) {
	cmd, err := commandFromArgs(args)
	if err != nil {
		return nil, err
	}
	env, err := parseEnv(f.env)
	if err != nil {
		return nil, err
	}
	env = append(env, secretEnv(env, f.envFromSecrets, secretKeys)...)
	if len(env) > bashtaskv1alpha1.MaxEnvEntries {
		return nil, fmt.Errorf("spec.env: %d entries (from --env and --env-from-secret) exceed the limit of %d", len(env), bashtaskv1alpha1.MaxEnvEntries)
	}
	if err := charLimit("--owner", "spec.owner", f.owner); err != nil {
		return nil, err
	}
	if err := charLimit("--node", "spec.nodeName", f.node); err != nil {
		return nil, err
	}
	if f.tty && (f.stream || f.detach) {
		return nil, errors.New("-t with --stream or --detach: a terminal is the task's input, attached until the task ends (attach again with kubectl bashtask attach)")
	}
	if f.stream && !f.stdin {
		return nil, errors.New("--stream needs -i: it streams the local stdin to the task")
	}
	if f.stdinIdle != 0 && !f.stream {
		return nil, errors.New("--stdin-idle-timeout needs --stream (spec.stdinStream.idleTimeoutSeconds)")
	}
	if f.workspace != "" && f.node != "" {
		return nil, errors.New("--node and --workspace: a task of a workspace runs on the workspace's node; give one of them")
	}
	if f.workspace != "" && (f.image != "" || len(f.imagePullSecrets) > 0) {
		return nil, errors.New("--image and --workspace: a task of a workspace runs in the workspace's image (kubectl bashtask workspace create --image); give one of them")
	}
	image, pullSecrets, err := imageFlags(f.image, f.imagePullSecrets)
	if err != nil {
		return nil, err
	}
	if f.workingDir != "" && f.workspace == "" && !strings.HasPrefix(f.workingDir, "/") {
		return nil, fmt.Errorf("--workdir %q: spec.workingDir must be absolute, or relative to the root of a --workspace", f.workingDir)
	}
	if err := checkWaitFlags(f); err != nil {
		return nil, err
	}
	ttl, err := ttlSeconds(f.ttl)
	if err != nil {
		return nil, err
	}
	bt := &bashtaskv1alpha1.BashTask{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: f.name},
		Spec: bashtaskv1alpha1.BashTaskSpec{
			Command:    cmd,
			Stdin:      stdin,
			Env:        env,
			Owner:      optional(f.owner),
			NodeName:   optional(f.node),
			Workspace:  optional(f.workspace),
			WorkingDir: optional(f.workingDir),

			Image:            image,
			ImagePullSecrets: pullSecrets,

			TTLSecondsAfterFinished: ttl,
		},
	}
	if err := taskEgress(bt, f); err != nil {
		return nil, err
	}
	if f.tty {
		bt.Spec.Stdin = nil
		bt.Spec.TTY = ptr.To(true)
	}
	if f.stream {
		bt.Spec.Stdin = nil
		bt.Spec.StdinStream = &bashtaskv1alpha1.StdinStream{}
		if f.stdinIdle != 0 {
			secs := (f.stdinIdle + time.Second - 1) / time.Second
			if f.stdinIdle < 0 || secs > maxStdinIdleSeconds {
				return nil, fmt.Errorf("--stdin-idle-timeout %s: spec.stdinStream.idleTimeoutSeconds must be 1 to %d seconds", f.stdinIdle, maxStdinIdleSeconds)
			}
			bt.Spec.StdinStream.IdleTimeoutSeconds = ptr.To(int32(secs))
		}
	}
	if f.name == "" {
		bt.GenerateName = generateNamePrefix
	}
	if timeoutSet {
		if bt.Spec.TimeoutSeconds, err = timeoutSeconds(f.timeout); err != nil {
			return nil, err
		}
	}
	return bt, nil
}

// maxImagePullSecrets is spec.imagePullSecrets' schema limit.
const maxImagePullSecrets = 16

// imageFlags checks --image with the reference grammar the controller
// applies (go-containerregistry's name.ParseReference) and turns it and
// --image-pull-secret into spec.image and spec.imagePullSecrets; nil for
// none. Pull secrets without an image, or more than 16, are refused.
func imageFlags(image string, secrets []string) (*bashtaskv1alpha1.ImageReference, []bashtaskv1alpha1.ImagePullSecret, error) {
	if image == "" {
		if len(secrets) > 0 {
			return nil, nil, errors.New("--image-pull-secret needs --image: the Secrets hold the credentials that pull it")
		}
		return nil, nil, nil
	}
	if _, err := name.ParseReference(image); err != nil {
		return nil, nil, fmt.Errorf("--image %q: spec.image is not an image reference ([registry/]repository[:tag][@sha256:digest]): %w", image, err)
	}
	if len(secrets) > maxImagePullSecrets {
		return nil, nil, fmt.Errorf("--image-pull-secret: %d Secrets, over the limit of %d of spec.imagePullSecrets", len(secrets), maxImagePullSecrets)
	}
	var out []bashtaskv1alpha1.ImagePullSecret
	for _, s := range secrets {
		if s == "" {
			return nil, nil, errors.New("--image-pull-secret: a Secret's name must not be empty")
		}
		if err := charLimit("--image-pull-secret", "spec.imagePullSecrets[].name", s); err != nil {
			return nil, nil, err
		}
		out = append(out, bashtaskv1alpha1.ImagePullSecret{Name: s})
	}
	return ptr.To(bashtaskv1alpha1.ImageReference(image)), out, nil
}

// charLimit checks that the value of flag, the API field field, has at
// most maxNameChars characters (the schema's MaxLength counts characters).
func charLimit(flag, field, s string) error {
	if n := len([]rune(s)); n > maxNameChars {
		return fmt.Errorf("%s: %s is %d characters, over the limit of %d", flag, field, n, maxNameChars)
	}
	return nil
}

// optional returns s as an optional field of the API: nil when s is empty,
// so that a flag left unset leaves the field out instead of sending "".
func optional(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

// checkWaitFlags refuses the flags that contradict each other on how run
// waits: --detach does not wait, so nothing that shapes the wait goes
// with it.
func checkWaitFlags(f runFlags) error {
	if f.waitTimeout < 0 {
		return fmt.Errorf("--wait-timeout %s: must not be negative", f.waitTimeout)
	}
	if !f.detach {
		return nil
	}
	switch {
	case f.stream:
		return errors.New("--detach and --stream: --stream sends the local stdin while run waits, and --detach does not wait (-i without --stream sends it with the task)")
	case f.rm:
		return errors.New("--detach and --rm: --rm deletes the task when run has seen it end, and --detach does not wait (--ttl deletes it after its end)")
	case f.waitTimeout != 0:
		return errors.New("--detach and --wait-timeout: --detach does not wait (--timeout is the task's own limit)")
	}
	return nil
}

// ttlSeconds converts --ttl to spec.ttlSecondsAfterFinished, rounding up
// to whole seconds; nil for 0, which keeps the task.
func ttlSeconds(d time.Duration) (*int32, error) {
	if d < 0 {
		return nil, fmt.Errorf("--ttl %s: must not be negative (0 leaves the controller's default TTL, an hour unless configured)", d)
	}
	if d == 0 {
		return nil, nil
	}
	s := (d + time.Second - 1) / time.Second
	if s > math.MaxInt32 {
		return nil, fmt.Errorf("--ttl %s: spec.ttlSecondsAfterFinished is at most %d seconds", d, math.MaxInt32)
	}
	return ptr.To(int32(s)), nil
}
