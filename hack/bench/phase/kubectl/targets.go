package kubectl

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"regexp"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/remotecommand"
	"k8s.io/streaming/pkg/httpstream"
	"k8s.io/utils/ptr"
	ctrlclient "sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/bashtask/bashtask-operator/api/v1alpha1"
	"github.com/bashtask/bashtask-operator/client"
	"github.com/bashtask/bashtask-operator/hack/bench/phase/portforward"
)

// podName is the pod's name, container its container's.
const podName, container = "pf", "server"

// targets are the two sides on the cluster: workspace portforward.Workspace
// with the server and a terminal task, and the pod with the same server.
type targets struct {
	o   options
	cfg *rest.Config
	k8s ctrlclient.Client
	cs  kubernetes.Interface
	oc  *client.Client
	// task is the workspace's task with spec.tty running cat.
	task *v1.BashTask
	pod  bool
}

// setup makes the workspace with its server and terminal task, and the
// pod.
func (t *targets) setup(ctx context.Context) error {
	if err := portforward.Setup(ctx, t.k8s, t.oc, namespace, t.o.timeout); err != nil {
		return fmt.Errorf("the workspace's server: %w", err)
	}
	task, err := t.oc.Start(ctx, client.RunOptions{Namespace: namespace, GenerateName: "echo-", Workspace: portforward.Workspace,
		Command: "cat > /dev/null", TTY: true, Timeout: 10 * time.Minute})
	if err != nil {
		return fmt.Errorf("the terminal task: %w", err)
	}
	t.task = task
	ref, err := importImage(ctx, t.o.containerd, t.o.imageArchive)
	if err != nil {
		return err
	}
	return t.startPod(ctx, ref)
}

// importImage imports the image archive into the node's containerd (the
// namespace kubelet's images are in) and returns its reference.
func importImage(ctx context.Context, address, archive string) (string, error) {
	out, err := exec.CommandContext(ctx, "ctr", "--address", address, "-n", "k8s.io", "images", "import", archive).CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("importing %s into the node's containerd: %w: %s", archive, err, out)
	}
	m := regexp.MustCompile(`unpacking (\S+) \(`).FindSubmatch(out)
	if m == nil {
		return "", fmt.Errorf("importing %s: no image named in ctr's output: %s", archive, out)
	}
	return string(m[1]), nil
}

// startPod starts the pod running the server in image ref and waits until
// it is Ready (its HTTP port accepts connections on the pod's loopback).
func (t *targets) startPod(ctx context.Context, ref string) error {
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: podName}, Spec: corev1.PodSpec{
		TerminationGracePeriodSeconds: ptr.To[int64](1),
		Containers: []corev1.Container{{
			Name: container, Image: ref, ImagePullPolicy: corev1.PullNever, WorkingDir: "/tmp",
			Command: []string{"bash", "-c", portforward.ServerScript(portforward.BytesPort, portforward.HTTPPort)},
			// The server listens on the pod's loopback only, as in the
			// workspace: the probe connects from inside.
			ReadinessProbe: &corev1.Probe{PeriodSeconds: 1, ProbeHandler: corev1.ProbeHandler{
				Exec: &corev1.ExecAction{Command: []string{"bash", "-c", fmt.Sprintf("echo > /dev/tcp/127.0.0.1/%d", portforward.HTTPPort)}}}},
		}},
	}}
	pods := t.cs.CoreV1().Pods(namespace)
	if _, err := pods.Create(ctx, pod, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("creating pod %s/%s: %w", namespace, podName, err)
	}
	t.pod = true
	for deadline := time.Now().Add(t.o.timeout); ; time.Sleep(200 * time.Millisecond) {
		pod, err := pods.Get(ctx, podName, metav1.GetOptions{})
		if err != nil {
			return err
		}
		for _, c := range pod.Status.Conditions {
			if c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("pod %s/%s not Ready within %s: %+v", namespace, podName, t.o.timeout, pod.Status)
		}
	}
}

// cleanup cancels the terminal task and deletes the workspace and the pod.
func (t *targets) cleanup() {
	ctx, cancel := context.WithTimeout(context.Background(), t.o.timeout)
	defer cancel()
	if t.task != nil {
		_ = t.oc.Cancel(ctx, namespace, t.task.Name, t.task.UID)
	}
	if t.pod {
		_ = t.cs.CoreV1().Pods(namespace).Delete(ctx, podName, metav1.DeleteOptions{})
	}
	_ = t.oc.DeleteWorkspace(ctx, namespace, portforward.Workspace)
}

// attachTask attaches to the terminal task (bashtasks/attach).
func (t *targets) attachTask(ctx context.Context, stdin io.Reader, stdout io.Writer) error {
	return t.oc.Attach(ctx, namespace, t.task.Name, client.AttachOptions{Stdin: stdin, Stdout: stdout})
}

// execPod runs `cat > /dev/null` in the pod with a terminal, as kubectl
// exec -it does: pods/exec through client-go's WebSocket executor, SPDY
// when the upgrade fails.
func (t *targets) execPod(ctx context.Context, stdin io.Reader, stdout io.Writer) error {
	u := t.cs.CoreV1().RESTClient().Post().Resource("pods").Namespace(namespace).Name(podName).SubResource("exec").
		VersionedParams(&corev1.PodExecOptions{Container: container, Command: []string{"sh", "-c", "cat > /dev/null"},
			Stdin: true, Stdout: true, TTY: true}, scheme.ParameterCodec).URL()
	ws, err := remotecommand.NewWebSocketExecutor(t.cfg, "GET", u.String())
	if err != nil {
		return err
	}
	spdy, err := remotecommand.NewSPDYExecutor(t.cfg, "POST", u)
	if err != nil {
		return err
	}
	ex, err := remotecommand.NewFallbackExecutor(ws, spdy, func(err error) bool {
		return httpstream.IsUpgradeFailure(err) || httpstream.IsHTTPSProxyError(err)
	})
	if err != nil {
		return err
	}
	err = ex.StreamWithContext(ctx, remotecommand.StreamOptions{Stdin: stdin, Stdout: stdout, Tty: true})
	if ctx.Err() != nil {
		return nil
	}
	return err
}

// forwardWorkspace starts the Go client's PortForward of the server's two
// ports and returns their local ports once they listen.
func (t *targets) forwardWorkspace(ctx context.Context) ([]uint16, <-chan error, error) {
	ready := make(chan []client.ForwardedPort, 1)
	done := make(chan error, 1)
	go func() {
		done <- t.oc.PortForward(ctx, namespace, portforward.Workspace, serverPorts(), client.PortForwardOptions{
			Ready: func(p []client.ForwardedPort) { ready <- p },
		})
	}()
	select {
	case p := <-ready:
		return []uint16{p[0].Local, p[1].Local}, done, nil
	case err := <-done:
		return nil, nil, fmt.Errorf("port-forward ended before it listened: %w", err)
	}
}

// forwardLine is kubectl port-forward's line for a port that listens.
var forwardLine = regexp.MustCompile(`^Forwarding from 127\.0\.0\.1:(\d+) -> (\d+)`)

// forwardPod runs `kubectl port-forward pod/pf` of the server's two ports
// and returns their local ports once kubectl says they listen.
func (t *targets) forwardPod(ctx context.Context) ([]uint16, <-chan error, error) {
	args := append([]string{"--kubeconfig", t.o.kubeconfig, "-n", namespace, "port-forward", "pod/" + podName, "--address", "127.0.0.1"}, serverPorts()...)
	cmd := exec.CommandContext(ctx, t.o.kubectl, args...)
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, nil, err
	}
	done := make(chan error, 1)
	ports, err := readForwardedPorts(bufio.NewScanner(out))
	go func() {
		_, _ = io.Copy(io.Discard, out)
		err := cmd.Wait()
		if ctx.Err() != nil {
			err = nil // stopped, as asked
		}
		done <- err
	}()
	if err != nil {
		return nil, nil, errors.Join(err, <-done)
	}
	return ports, done, nil
}

// readForwardedPorts reads kubectl's lines until both of the server's
// ports listen, and returns their local ports in serverPorts' order.
func readForwardedPorts(sc *bufio.Scanner) ([]uint16, error) {
	byRemote := map[int]uint16{}
	for len(byRemote) < 2 && sc.Scan() {
		m := forwardLine.FindStringSubmatch(sc.Text())
		if m == nil {
			continue
		}
		local, _ := strconv.ParseUint(m[1], 10, 16)
		remote, _ := strconv.Atoi(m[2])
		byRemote[remote] = uint16(local)
	}
	if len(byRemote) < 2 {
		return nil, fmt.Errorf("kubectl port-forward ended before both ports listened (reading its output: %w)", sc.Err())
	}
	return []uint16{byRemote[portforward.BytesPort], byRemote[portforward.HTTPPort]}, nil
}

// serverPorts are the port specifications of the server's two ports, on
// any free local port.
func serverPorts() []string {
	return []string{fmt.Sprintf("0:%d", portforward.BytesPort), fmt.Sprintf("0:%d", portforward.HTTPPort)}
}
