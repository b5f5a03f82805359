package main

import (
	"flag"
	"fmt"
	"net"

	_ "gocloud.dev/blob/azureblob" // the bucket drivers the agents link
	_ "gocloud.dev/blob/fileblob"
	_ "gocloud.dev/blob/gcsblob"
	_ "gocloud.dev/blob/s3blob"

	"github.com/bashtask/bashtask-operator/operator"
)

// outputAPIOptions are the output.bashtask.dev server's options from the
// flags: a zero Port (--output-api-port 0) serves none.
func outputAPIOptions(o *options) (operator.OutputAPIOptions, error) {
	if o.outputAPIPort <= 0 {
		return operator.OutputAPIOptions{}, nil
	}
	bind := net.ParseIP(o.outputAPIBind)
	if bind == nil {
		return operator.OutputAPIOptions{}, fmt.Errorf("--output-api-bind-address %q: not an IP address", o.outputAPIBind)
	}
	// The server authenticates and authorizes its requests through the
	// same kube-apiserver as the manager.
	kubeconfig := ""
	if f := flag.Lookup("kubeconfig"); f != nil {
		kubeconfig = f.Value.String()
	}
	return operator.OutputAPIOptions{
		Port: o.outputAPIPort, BindAddress: bind, CertDir: o.outputAPICertDir, Kubeconfig: kubeconfig,
		BucketURL: o.outputBucketURL,
	}, nil
}
