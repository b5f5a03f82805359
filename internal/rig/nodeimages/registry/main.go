// Command registry is the registry image of internal/rig/nodeimages: the
// registry of internal/rig/registry (go-containerregistry's, its blobs on
// disk) listening on every address of its pod, for the one-node cluster
// (internal/rig/nodecluster), whose agent pulls the task images from it
// through a Service (docs/images.md, "Images on the machine").
//
// It has no TLS; with -private-basic-auth a repository whose path holds
// "/private/" wants basic authentication as registry.TestUser and
// registry.TestPassword (registry.GuardPrivateForTest), for the tests of
// image pull secrets. It stops on SIGTERM or SIGINT.
//
// It lives beside the package that builds its image: nothing else uses it.
package main

import (
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/bashtask/bashtask-operator/internal/rig/registry"
)

func main() {
	o := registry.Options{AnyHost: true, Log: os.Stderr}
	var private bool
	flag.StringVar(&o.Addr, "addr", ":5000", "TCP address to listen on")
	flag.StringVar(&o.Dir, "dir", "/var/lib/registry", "directory of the blobs and the manifests' records")
	flag.BoolVar(&private, "private-basic-auth", false, `repositories whose path holds "/private/" want the test credentials (basic authentication)`)
	flag.Parse()
	if flag.NArg() > 0 {
		fatalf("unexpected arguments %q", flag.Args())
	}
	if private {
		o.Wrap = registry.GuardPrivateForTest
	}
	r, err := registry.Start(o)
	if err != nil {
		fatalf("%v", err)
	}
	fmt.Fprintf(os.Stderr, "registry: serving %s on %s\n", o.Dir, r.Host())
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
	go func() {
		<-sigs
		_ = r.Close()
	}()
	if err := r.Wait(); err != nil {
		fatalf("%v", err)
	}
}

func fatalf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "registry: "+format+"\n", args...)
	os.Exit(1)
}
