package client_test

import (
	"context"
	"fmt"
	"io"
	"os"
	"time"

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

// ExampleClient_Run is a platform's whole use of the client: one client
// for the process, then a command in a session's workspace, its output
// streamed to this process's stdout and stderr, its exit code returned.
func ExampleClient_Run() {
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
	res, err := c.Run(context.Background(), client.RunOptions{
		Namespace:   "agents",
		Workspace:   "session-42",
		Owner:       "agent-7", // the workspace's owner
		Command:     "cd repo && make test",
		Timeout:     5 * time.Minute, // the command's own limit, once it runs
		WaitTimeout: 6 * time.Minute, // the whole wait, pending included
		Stdout:      os.Stdout,
		Stderr:      os.Stderr,
		Notes:       os.Stderr, // why it waits, processes it left behind
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, err) // e.g. a *client.WaitTimeoutError
		return
	}
	fmt.Println("exit code", res.ExitCode, res.Reason)
}

// ExampleClient_Start starts a server as a task of its own in a
// workspace, detached, and reads its output later from an offset.
func ExampleClient_Start() {
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
	ctx := context.Background()
	srv, err := c.Start(ctx, client.RunOptions{Namespace: "agents", Workspace: "session-42", Owner: "agent-7",
		Command: "python3 -m http.server 8000", Timeout: 10 * time.Minute})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return
	}
	// Other tasks of the workspace reach it on 127.0.0.1:8000 while it runs.
	r, err := c.FollowLog(ctx, srv.Namespace, srv.Name, client.LogOptions{Stream: "stderr", Offset: 0})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return
	}
	defer r.Close()
	_, _ = io.Copy(os.Stdout, r)
	_ = c.Cancel(ctx, srv.Namespace, srv.Name, srv.UID)
}
