// Command bashtask-shim is the task shim of the agent's tenant isolation
// level on its own: the agent starts it as PID 1 of each task's new
// namespaces (package executor/shim has the protocol). The agent's own
// binary can be the shim too; this one links nothing but the shim, so it
// starts with a fraction of the agent's CPU time (the Go runtime's start
// grows with the binary, and the agent's libraries initialise packages
// the shim never uses), which every task at the tenant level pays.
//
// The agent uses it when it lies beside the agent's binary, or when its
// --shim-path names it. Run by hand it only says so.
package main

import (
	"fmt"
	"os"

	"github.com/bashtask/bashtask-operator/executor/shim"
)

func main() {
	// Returns only when not started as a shim (argv[0] is not shim.Arg0).
	shim.Main()
	fmt.Fprintf(os.Stderr, "bashtask-shim: started by bashtask-agent at --isolation=tenant as each task's shim (protocol %s); not a command to run by hand\n", shim.Protocol)
	os.Exit(2)
}
