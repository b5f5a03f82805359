package client_test

import (
	"context"
	"fmt"
	"io"
	"os"

	"k8s.io/client-go/tools/clientcmd"

	"github.com/bashtask/bashtask-operator/client"
)

// ExampleClient_FollowLog copies a task's stdout to this process's stdout
// while the task runs, resuming after dropped connections, until the task
// has ended and every byte was copied.
func ExampleClient_FollowLog() {
	cfg, err := clientcmd.BuildConfigFromFlags("", os.Getenv("KUBECONFIG"))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return
	}
	c, err := client.New(cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return
	}
	r, err := c.FollowLog(context.Background(), "default", "hello", client.LogOptions{Stream: "stdout", Follow: true})
	if err != nil {
		fmt.Fprintln(os.Stderr, err) // e.g. 403: no get on output.bashtask.dev bashtasks/log
		return
	}
	defer r.Close()
	if _, err := io.Copy(os.Stdout, r); err != nil {
		fmt.Fprintln(os.Stderr, "stopped at offset", r.Offset(), err)
	}
}
