//go:build linux

package executor

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
)

// userNamespacesOnce caches [UserNamespaces]' answer: the node's setting
// does not change under a running agent as far as it is concerned.
var userNamespacesOnce = sync.OnceValue(probeUserNamespaces)

// UserNamespaces reports whether this node lets the agent make user
// namespaces, which a task root inside its image needs
// (Root.RootInside; docs/images.md, "Root inside"): nil, or an error
// naming the setting that forbids them, user.max_user_namespaces 0 (the
// agent makes them as root, so kernel.unprivileged_userns_clone and
// AppArmor's restriction of unprivileged ones do not apply).
func UserNamespaces() error { return userNamespacesOnce() }

func probeUserNamespaces() error {
	b, err := os.ReadFile("/proc/sys/user/max_user_namespaces")
	if errors.Is(err, os.ErrNotExist) {
		return errors.New("this kernel has no user namespaces (no /proc/sys/user/max_user_namespaces)")
	}
	if err != nil {
		return fmt.Errorf("reading user.max_user_namespaces: %w", err)
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		return fmt.Errorf("user.max_user_namespaces %q: %w", strings.TrimSpace(string(b)), err)
	}
	if n == 0 {
		return errors.New("user namespaces are disabled on this node (sysctl user.max_user_namespaces is 0)")
	}
	return nil
}
