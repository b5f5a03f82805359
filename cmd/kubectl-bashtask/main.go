// Command kubectl-bashtask is the kubectl plugin for BashTask resources:
// `kubectl bashtask run|logs|cancel|wait|get`. The commands live in the
// plugin package; this main only connects them to the process: arguments,
// standard streams, signals and the exit status.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/go-logr/logr"
	"k8s.io/cli-runtime/pkg/genericiooptions"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/bashtask/bashtask-operator/cmd/kubectl-bashtask/plugin"
)

func main() {
	// The client library logs through controller-runtime's logger; a CLI
	// reports on stderr itself, and an unset logger would print a warning.
	ctrllog.SetLogger(logr.Discard())
	// Buffered so that a second Ctrl-C pressed while the first is handled
	// is not dropped: run needs both (cancel, then stop waiting).
	interrupts := make(chan os.Signal, 2)
	signal.Notify(interrupts, os.Interrupt, syscall.SIGTERM)
	os.Exit(plugin.Main(context.Background(), plugin.Options{
		IOStreams:  genericiooptions.IOStreams{In: os.Stdin, Out: os.Stdout, ErrOut: os.Stderr},
		Interrupts: interrupts,
	}, os.Args[1:]))
}
