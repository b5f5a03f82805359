package executor

import (
	"fmt"
	"slices"
	"strings"
)

// EnvOptions are the inputs of [BuildEnv].
type EnvOptions struct {
	// Mode selects how much of Ambient passes; empty means AmbientScrub.
	Mode AmbientMode
	// Allowlist names the ambient variables passed in AmbientAllowlist mode.
	Allowlist []string
	// Ambient is the agent's environment as NAME=VALUE strings (os.Environ
	// form); entries without '=' are ignored, a later duplicate wins.
	Ambient []string
	// Identity describes the user the task runs as (HOME, USER, LOGNAME,
	// EMAIL at the tenant level), applied after the terminal settings and
	// before Explicit: they replace the agent's own values, which name the
	// agent's user, and a task that sets one of them explicitly (a HOME in
	// its working directory) gets its own value, as for any other name.
	Identity []EnvVar
	// Carried are a workspace task's carried variables, applied after
	// Identity and before Explicit.
	Carried []EnvVar
	// Explicit is the task's own environment.
	Explicit []EnvVar
	// Managed are the managed facts, applied last.
	Managed []EnvVar
}

// Fixed terminal settings (docs/executor.md, "Environment"): commands run
// without a terminal, so tools must neither colour nor page their output.
var terminalEnv = []EnvVar{
	{"NO_COLOR", "1"},
	{"TERM", "dumb"},
	{"PAGER", "cat"},
	{"GIT_PAGER", "cat"},
}

// Shell start-up hooks: any of these makes bash run code of the agent's
// environment before the command (BASH_ENV, ENV) or change how the command
// is parsed (SHELLOPTS, BASHOPTS). BASH_FUNC_* carry exported functions that
// can shadow commands.
var shellHookNames = []string{"BASH_ENV", "ENV", "SHELLOPTS", "BASHOPTS"}

// ManagedPrefix is the prefix of the names the agent manages; ambient
// variables with it (in any case) are dropped by the scrub so a stale value
// of the agent's own environment never looks like a managed fact.
const ManagedPrefix = "BASHTASK_"

// Scrubbed reports whether the scrub drops the ambient variable name:
// names containing KEY, SECRET, TOKEN or PASSWORD (case-insensitive
// substring), names starting with BASHTASK_ (case-insensitive) and the shell
// start-up hooks. The rule is docs/executor.md's, "Environment".
func Scrubbed(name string) bool {
	upper := strings.ToUpper(name)
	for _, s := range []string{"KEY", "SECRET", "TOKEN", "PASSWORD"} {
		if strings.Contains(upper, s) {
			return true
		}
	}
	if strings.HasPrefix(upper, ManagedPrefix) {
		return true
	}
	return slices.Contains(shellHookNames, name) || strings.HasPrefix(name, "BASH_FUNC_")
}

// ValidateEnvVar checks one entry the way execve needs it. It returns
// ErrEnvNameEmpty, ErrEnvNameEquals, ErrEnvNUL or ErrArgumentTooLong
// (NAME=VALUE with its NUL over MaxArgStrlen), each in a [*StartError]
// naming the variable.
func ValidateEnvVar(v EnvVar) error {
	switch {
	case v.Name == "":
		return startErr(ErrEnvNameEmpty, "", nil)
	case strings.IndexByte(v.Name, 0) >= 0:
		return startErr(ErrEnvNUL, fmt.Sprintf("name %q", v.Name), nil)
	case strings.IndexByte(v.Name, '=') >= 0:
		return startErr(ErrEnvNameEquals, fmt.Sprintf("%q", v.Name), nil)
	case strings.IndexByte(v.Value, 0) >= 0:
		return startErr(ErrEnvNUL, fmt.Sprintf("value of %s", v.Name), nil)
	case len(v.Name)+1+len(v.Value)+1 > MaxArgStrlen:
		return startErr(ErrArgumentTooLong, fmt.Sprintf("environment entry %s is %d bytes, limit %d", v.Name, len(v.Name)+1+len(v.Value), MaxArgStrlen-1), nil)
	}
	return nil
}

// BuildEnv returns a task's environment as NAME=VALUE strings sorted by
// name, built in the order of docs/executor.md with later steps winning:
// LANG=C.UTF-8 when the result would set neither LANG nor LC_ALL; the
// ambient environment filtered by Mode; the fixed terminal settings; the
// identity entries; a workspace's carried entries; the explicit entries;
// the managed entries. Identity, carried, explicit and managed entries are
// validated with [ValidateEnvVar]; the first invalid one is returned as the
// error. Ambient entries are passed as the agent received them.
func BuildEnv(o EnvOptions) ([]string, error) {
	for _, list := range [][]EnvVar{o.Identity, o.Carried, o.Explicit, o.Managed} {
		for _, v := range list {
			if err := ValidateEnvVar(v); err != nil {
				return nil, err
			}
		}
	}
	allowed, err := ambientFilter(o.Mode, o.Allowlist)
	if err != nil {
		return nil, err
	}

	env := make(map[string]string, len(o.Ambient)+len(terminalEnv)+len(o.Identity)+len(o.Explicit)+len(o.Managed)+1)
	for _, kv := range o.Ambient {
		name, value, ok := strings.Cut(kv, "=")
		// An entry without '=' or with an empty name cannot be passed on
		// faithfully (shells ignore it), and one with a NUL would make
		// execve fail; the agent's own environment never has those, an
		// injected one might.
		if !ok || name == "" || strings.IndexByte(kv, 0) >= 0 || !allowed(name) {
			continue
		}
		env[name] = value
	}
	for _, list := range [][]EnvVar{terminalEnv, o.Identity, o.Carried, o.Explicit, o.Managed} {
		for _, v := range list {
			env[v.Name] = v.Value
		}
	}
	_, hasLang := env["LANG"]
	_, hasLCAll := env["LC_ALL"]
	if !hasLang && !hasLCAll {
		// Step 1 comes first, so it only applies when nothing later set
		// either variable.
		env["LANG"] = "C.UTF-8"
	}

	names := make([]string, 0, len(env))
	for name := range env {
		names = append(names, name)
	}
	slices.Sort(names)
	out := make([]string, len(names))
	for i, name := range names {
		out[i] = name + "=" + env[name]
	}
	return out, nil
}

// ambientFilter returns the test an ambient variable name must pass in
// mode.
func ambientFilter(mode AmbientMode, allowlist []string) (func(string) bool, error) {
	switch mode {
	case "", AmbientScrub:
		return func(name string) bool { return !Scrubbed(name) }, nil
	case AmbientAllowlist:
		return func(name string) bool { return slices.Contains(allowlist, name) }, nil
	case AmbientInherit:
		return func(string) bool { return true }, nil
	}
	return nil, fmt.Errorf("%w: ambient env mode %q", ErrInvalidConfig, mode)
}

// filterAmbient keeps the entries of ambient whose name mode lets through,
// in their order, so that BuildEnv in AmbientInherit mode over the result
// gives what BuildEnv in mode gives over ambient.
func filterAmbient(mode AmbientMode, allowlist, ambient []string) ([]string, error) {
	allowed, err := ambientFilter(mode, allowlist)
	if err != nil {
		return nil, err
	}
	out := make([]string, 0, len(ambient))
	for _, kv := range ambient {
		if name, _, ok := strings.Cut(kv, "="); ok && allowed(name) {
			out = append(out, kv)
		}
	}
	return out, nil
}
