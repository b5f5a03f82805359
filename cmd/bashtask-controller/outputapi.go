package main

import (
	"context"
	"crypto/tls"
	"flag"
	"fmt"
	"net"

	_ "gocloud.dev/blob/azureblob" // the bucket drivers the agents link
	_ "gocloud.dev/blob/fileblob"
	_ "gocloud.dev/blob/gcsblob"
	_ "gocloud.dev/blob/s3blob"
	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/bashtask/bashtask-operator/agentpool"
	"github.com/bashtask/bashtask-operator/outputapi"
)

// addOutputAPI adds the output.bashtask.dev server to the manager; it runs
// on every replica (not only the leader), reading tasks from the manager's
// cache (whose BashTask informer wakes the requests waiting for a task's
// dispatch) and output from the agents with the controller's client
// certificate.
func addOutputAPI(ctx context.Context, mgr ctrl.Manager, o *options, tlsCfg *tls.Config) error {
	agents, err := agentpool.NewAgentReaders(mgr.GetClient(), o.agentNamespace, o.agentService, o.agentPortName, tlsCfg)
	if err != nil {
		return err
	}
	bind := net.ParseIP(o.outputAPIBind)
	if bind == nil {
		return fmt.Errorf("--output-api-bind-address %q: not an IP address", o.outputAPIBind)
	}
	kubeconfig := ""
	if f := flag.Lookup("kubeconfig"); f != nil {
		kubeconfig = f.Value.String()
	}
	srv, err := outputapi.New(ctx, outputapi.Config{
		BindAddress: bind, Port: o.outputAPIPort, CertDir: o.outputAPICertDir, Kubeconfig: kubeconfig,
		Tasks: mgr.GetClient(), LiveTasks: mgr.GetAPIReader(), Informers: mgr.GetCache(), Agents: agents, BucketURL: o.outputBucketURL,
	})
	if err != nil {
		return err
	}
	return mgr.Add(srv)
}
