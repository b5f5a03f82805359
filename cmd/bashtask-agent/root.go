package main

import "github.com/spf13/cobra"

// newRootCommand builds the command tree: the root will run the agent
// server; subcommands are tools around it.
func newRootCommand() *cobra.Command {
	root := &cobra.Command{
		Use:           "bashtask-agent",
		Short:         "Node-local executor agent for BashTask resources",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.AddCommand(newExecCommand())
	addServe(root)
	return root
}
