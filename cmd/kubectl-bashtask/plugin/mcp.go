package plugin

import (
	"io"

	"github.com/spf13/cobra"

	"github.com/bashtask/bashtask-operator/mcpserver"
)

func (a *app) mcpCommand() *cobra.Command {
	var owner, httpAddr string
	cmd := &cobra.Command{
		Use:   "mcp --owner OWNER [--http ADDR]",
		Short: "Serve workspaces to a model as a Model Context Protocol server",
		Long: `mcp serves the Model Context Protocol: tools that create, fork, suspend,
resume and delete workspaces, run and start commands in them, read their output by
byte offset, write their standard input, cancel them, and read, write and
list files; each workspace's files are also resources
(bashtask://WORKSPACE/PATH). It serves stdio by default, for a client that
starts it (Claude Code, Codex), and Streamable HTTP with --http.

Every workspace and task it creates or touches has the owner --owner; an
owner a model names is ignored. Over stdio it acts with your kubeconfig;
over HTTP every request needs "Authorization: Bearer TOKEN", a token the API
server authenticates, and runs with that token alone (the kubeconfig gives
only the API server's address and CA), so RBAC decides as for kubectl.
See docs/mcp.md.`,
		Example: `  kubectl bashtask mcp -n agents --owner agent-7
  kubectl bashtask mcp -n agents --owner agent-7 --http :8080`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, ns, err := a.restConfig()
			if err != nil {
				return err
			}
			srv, err := mcpserver.New(mcpserver.Config{REST: cfg, Namespace: ns, Owner: owner, Version: "v1alpha1"})
			if err != nil {
				return err
			}
			ctx, stop := a.cancelOnInterrupt(cmd.Context())
			defer stop()
			if httpAddr != "" {
				a.note("serving MCP over Streamable HTTP on %s (namespace %s, owner %s)", httpAddr, ns, owner)
				return srv.ServeHTTP(ctx, httpAddr)
			}
			return srv.ServeStdio(ctx, io.NopCloser(a.opts.IOStreams.In), nopWriteCloser{a.opts.IOStreams.Out})
		},
	}
	cmd.Flags().StringVar(&owner, "owner", "", "the owner (spec.owner) of every workspace and task the server creates or touches; required")
	cmd.Flags().StringVar(&httpAddr, "http", "", "serve Streamable HTTP on this address (host:port) instead of stdio; each request needs a bearer token")
	return cmd
}

// nopWriteCloser is a writer whose Close does nothing: the server's end
// of stdio leaves the process's stdout open.
type nopWriteCloser struct{ io.Writer }

func (nopWriteCloser) Close() error { return nil }
