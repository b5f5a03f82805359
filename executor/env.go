package executor

import (
	"fmt"
	"regexp"
	"slices"
	"strings"
)

// EnvOptions are the inputs of [BuildEnv].
type EnvOptions struct {
	// Mode selects how much of Ambient passes; empty means AmbientScrub.
	Mode AmbientMode
	// Allowlist names the ambient variables passed in AmbientAllowlist mode.
	Allowlist []string
	// Defaults are applied first, so that the ambient environment and
	// everything after it replace them: at the tenant level PATH (
	// [DefaultTaskPath]), where no agent variable is inherited.
	Defaults []EnvVar
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
	// Terminal replaces the fixed settings for a command without a
	// terminal with TerminalTERM: the task has a terminal (Spec.Terminal)
	// and a person at it.
	Terminal bool
}

// TerminalTERM is TERM for a task with a terminal (Spec.Terminal), the
// terminal type of the clients that attach (xterm and its descendants,
// tmux, the terminal emulators of the browser), as `docker run -t` sets
// it; a task's own env may set another. NO_COLOR, PAGER and GIT_PAGER are
// not set: pagers and colours are for a person at a terminal.
const TerminalTERM = "xterm-256color"

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

// DefaultTaskPath is PATH at the tenant level unless the task sets one:
// the search path container runtimes give a container without an image
// PATH (containerd's and runc's default), the same on every node, so that
// no directory of the agent's own PATH leaks into a task.
const DefaultTaskPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// credentialSubstrings are the name fragments [Scrubbed] drops,
// case-insensitive: the design's KEY, SECRET, TOKEN and PASSWORD, and the
// shapes seen holding credentials besides (PASSWD, CREDENTIAL, the
// connection strings of database and storage drivers such as
// AZURE_STORAGE_CONNECTION_STRING).
var credentialSubstrings = []string{"KEY", "SECRET", "TOKEN", "PASSWORD", "PASSWD", "CREDENTIAL", "CONNECTION_STRING", "CONNECTIONSTRING", "CONN_STR"}

// credentialWords are the words of a name ('_'-, '-'- or '.'-separated,
// case-insensitive) [Scrubbed] drops: too short to match as substrings
// (PAT is in PATH), whole words they name a credential (GITHUB_PAT,
// PROXY_AUTH, DB_PWD).
var credentialWords = []string{"PAT", "AUTH", "PWD", "PASS", "CREDS"}

// Scrubbed reports whether the scrub drops the ambient variable name: a
// name containing one of credentialSubstrings or with one of
// credentialWords as a word (case-insensitive), a name starting with
// BASHTASK_ (case-insensitive) and the shell start-up hooks. PWD and
// OLDPWD, the shell's own, are not credentials and pass. The rule is
// docs/executor.md's, "Environment".
func Scrubbed(name string) bool {
	upper := strings.ToUpper(name)
	for _, s := range credentialSubstrings {
		if strings.Contains(upper, s) {
			return true
		}
	}
	if upper != "PWD" {
		for _, w := range strings.FieldsFunc(upper, func(r rune) bool { return r == '_' || r == '-' || r == '.' }) {
			if slices.Contains(credentialWords, w) {
				return true
			}
		}
	}
	if strings.HasPrefix(upper, ManagedPrefix) {
		return true
	}
	return slices.Contains(shellHookNames, name) || strings.HasPrefix(name, "BASH_FUNC_")
}

// urlWithPassword matches a URL whose user information has a password
// (scheme://user:password@host), as DATABASE_URL, REDIS_URL or a proxy
// URL carry one (RFC 3986, section 3.2.1).
var urlWithPassword = regexp.MustCompile(`[A-Za-z][A-Za-z0-9+.-]*://[^/?#@\s]*:[^/?#@\s]*@`)

// connectionStringSecret matches the secret keys of a connection string
// (Key=Value pairs separated by ';'), as Azure Storage, Service Bus and
// ADO.NET drivers read them.
var connectionStringSecret = regexp.MustCompile(`(?i)(^|;)\s*(AccountKey|SharedAccessKey|SharedAccessSignature|Password|Pwd)\s*=`)

// ScrubbedValue reports whether the scrub drops an ambient variable for
// its value, whatever its name: a URL with a password, or a connection
// string with a key or password.
func ScrubbedValue(value string) bool {
	return urlWithPassword.MatchString(value) || connectionStringSecret.MatchString(value)
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

	env := make(map[string]string, len(o.Defaults)+len(o.Ambient)+len(terminalEnv)+len(o.Identity)+len(o.Explicit)+len(o.Managed)+1)
	for _, v := range o.Defaults {
		env[v.Name] = v.Value
	}
	for _, kv := range o.Ambient {
		name, value, ok := strings.Cut(kv, "=")
		// An entry without '=' or with an empty name cannot be passed on
		// faithfully (shells ignore it), and one with a NUL would make
		// execve fail; the agent's own environment never has those, an
		// injected one might.
		if !ok || name == "" || strings.IndexByte(kv, 0) >= 0 || !allowed(name, value) {
			continue
		}
		env[name] = value
	}
	fixed := terminalEnv
	if o.Terminal {
		fixed = []EnvVar{{"TERM", TerminalTERM}}
	}
	for _, list := range [][]EnvVar{fixed, o.Identity, o.Carried, o.Explicit, o.Managed} {
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

// ambientFilter returns the test an ambient variable must pass in mode.
// An allow-listed name passes whatever its value: naming it is the
// operator's deliberate choice.
func ambientFilter(mode AmbientMode, allowlist []string) (func(name, value string) bool, error) {
	switch mode {
	case "", AmbientScrub:
		return func(name, value string) bool { return !Scrubbed(name) && !ScrubbedValue(value) }, nil
	case AmbientAllowlist:
		return func(name, _ string) bool { return slices.Contains(allowlist, name) }, nil
	case AmbientInherit:
		return func(string, string) bool { return true }, nil
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
		if name, value, ok := strings.Cut(kv, "="); ok && allowed(name, value) {
			out = append(out, kv)
		}
	}
	return out, nil
}
