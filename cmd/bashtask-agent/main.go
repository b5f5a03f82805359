// Command bashtask-agent is the node-local executor agent of bashtask. For
// now it offers the debug subcommand `exec`, which runs one command through
// the executor package and prints the Result.
package main

import (
	"errors"
	"fmt"
	"os"

	"github.com/bashtask/bashtask-operator/executor/shim"
)

func main() {
	// In shim mode (argv[0] "bashtask-shim") the binary is a task's shim
	// and never returns from here.
	shim.Main()
	if err := newRootCommand().Execute(); err != nil {
		// A command that did not start was already reported as JSON and
		// on stderr.
		if !errors.Is(err, errStartFailed) {
			fmt.Fprintln(os.Stderr, "bashtask-agent:", err)
		}
		os.Exit(1)
	}
}
