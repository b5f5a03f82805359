// Command pause is the process of a pod sandbox (the pause image of
// internal/rig/nodeimages): it holds the pod's namespaces while the pod lives,
// reaps the orphans reparented to it as PID 1 of a shared PID namespace,
// and exits with status 0 on SIGTERM or SIGINT, as the upstream pause does.
//
// It lives beside the package that builds its image: nothing else uses it,
// and the image's test builds it from there.
package main

import (
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	sigs := make(chan os.Signal, 16)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGCHLD)
	// After Notify: the tests wait for this line before they signal.
	if os.Getpid() != 1 {
		fmt.Fprintln(os.Stderr, "pause: warning: not PID 1, so orphans are not reparented to this process")
	}
	// Children that ended before Notify sent no signal we saw.
	reap()
	for sig := range sigs {
		if sig == syscall.SIGCHLD {
			reap()
			continue
		}
		fmt.Fprintf(os.Stderr, "pause: shutting down, got %v\n", sig)
		os.Exit(0)
	}
}

// reap collects every child that has exited. Signals coalesce, so one
// SIGCHLD may stand for several children: it loops until none is left.
func reap() {
	for {
		var ws syscall.WaitStatus
		pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
		if errors.Is(err, syscall.EINTR) {
			continue
		}
		if err != nil || pid <= 0 {
			return // ECHILD: no children; 0: none has exited yet
		}
	}
}
