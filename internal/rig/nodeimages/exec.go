package nodeimages

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
)

// outputTail is how much of a failed command's output its error carries,
// in bytes.
const outputTail = 4 << 10

// command prepares a command run in dir with the environment env. Canceling
// ctx stops the command's whole process group (see stopGroupOnCancel).
func command(ctx context.Context, dir string, env []string, name string, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = dir
	cmd.Env = env
	stopGroupOnCancel(cmd)
	return cmd
}

// run runs cmd. Its output is kept unless cmd already has somewhere to put
// it, and the error of a failed command ends with the last outputTail bytes
// of it.
func run(cmd *exec.Cmd) error {
	var out bytes.Buffer
	if cmd.Stdout == nil {
		cmd.Stdout = &out
	}
	if cmd.Stderr == nil {
		cmd.Stderr = &out
	}
	if err := cmd.Run(); err != nil {
		tail := out.Bytes()
		if len(tail) > outputTail {
			tail = tail[len(tail)-outputTail:]
			if i := bytes.IndexByte(tail, '\n'); i >= 0 {
				tail = tail[i+1:] // whole lines only
			}
		}
		msg := fmt.Sprintf("running %s: %v", strings.Join(cmd.Args, " "), err)
		if len(tail) > 0 {
			msg += "; output ends with:\n" + string(tail)
		}
		return &commandError{msg: msg, err: err}
	}
	return nil
}

// commandError is a failed command with the end of its output.
type commandError struct {
	msg string
	err error
}

func (e *commandError) Error() string { return e.msg }
func (e *commandError) Unwrap() error { return e.err }

// hostToolEnv is the environment of the host tools (debootstrap, chroot,
// tar): a root's PATH, the C locale (the chroot has no other) and the
// proxy settings of ours, which debootstrap's downloads honour.
func hostToolEnv() []string {
	env := []string{
		"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
		"LC_ALL=C",
		"DEBIAN_FRONTEND=noninteractive",
	}
	for _, k := range []string{"http_proxy", "https_proxy", "no_proxy", "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY"} {
		if v, ok := os.LookupEnv(k); ok {
			env = append(env, k+"="+v)
		}
	}
	return env
}
