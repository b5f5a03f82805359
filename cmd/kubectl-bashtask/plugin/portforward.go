package plugin

import (
	"github.com/spf13/cobra"

	btclient "github.com/bashtask/bashtask-operator/client"
)

func (a *app) portForwardCommand() *cobra.Command {
	var addresses []string
	cmd := &cobra.Command{
		Use:   "port-forward WORKSPACE [LOCAL:]REMOTE...",
		Short: "Forward local ports to ports on a workspace's loopback",
		Long: `Port-forward listens on local ports and forwards each connection to
127.0.0.1:REMOTE inside the workspace's own network namespace, through the
output API's bashworkspaces/portforward (RBAC: create and get on that
subresource of output.bashtask.dev), streamed as kubectl port-forward does. It
reaches the workspace and nothing else: not the node's loopback, not another
workspace. A workspace of network Node has no loopback of its own and is
refused. LOCAL 0, or ":REMOTE", takes any free local port. A connection to a
port nothing listens on fails with "connection refused" and ends the forward,
as kubectl port-forward does. It runs until interrupted (docs/portforward.md).`,
		Example: `  kubectl bashtask run -w dev -- 'nohup python3 -m http.server 8000 >/dev/null 2>&1 &'
  kubectl bashtask port-forward dev 8080:8000 &
  curl http://localhost:8080/`,
		Args: cobra.MinimumNArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			for _, p := range args[1:] {
				if _, err := btclient.ParsePortForward(p); err != nil {
					return err
				}
			}
			ctx, stop := a.cancelOnInterrupt(cmd.Context())
			defer stop()
			_, oc, ns, err := a.clients()
			if err != nil {
				return err
			}
			return oc.PortForward(ctx, ns, args[0], args[1:], btclient.PortForwardOptions{
				Addresses: addresses, Out: a.opts.IOStreams.Out, ErrOut: a.opts.IOStreams.ErrOut,
			})
		},
	}
	cmd.Flags().StringSliceVar(&addresses, "address", []string{"localhost"}, "local addresses to listen on (comma-separated IP addresses or localhost)")
	return cmd
}
