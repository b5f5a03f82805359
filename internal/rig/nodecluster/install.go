//go:build linux

package nodecluster

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
)

// Release describes a Helm release of the operator's chart.
type Release struct {
	// Name and Namespace of the release.
	Name, Namespace string
	// Chart is the chart's directory.
	Chart string
	// Helm is the helm binary.
	Helm string
	// Args are more `helm install` arguments (--set, -f).
	Args []string
	// Objects are manifests applied in the namespace before the chart is
	// installed (a Secret the values name, for example).
	Objects []string
}

// Run runs a program with the cluster's kubeconfig and the node binaries
// first on PATH, echoing the command line to the log, and returns its
// combined output; the error carries the output.
func (c *Cluster) Run(ctx context.Context, name string, args ...string) (string, error) {
	return c.RunInput(ctx, "", name, args...)
}

// RunInput is Run with stdin.
func (c *Cluster) RunInput(ctx context.Context, stdin, name string, args ...string) (string, error) {
	fmt.Fprintf(c.opts.Log, "+ %s %s\n", filepath.Base(name), strings.Join(args, " "))
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Stdin = strings.NewReader(stdin)
	cmd.Env = append(c.componentEnv(), "KUBECONFIG="+c.Kubeconfig(), "PATH="+c.opts.BinDir+":"+os.Getenv("PATH"))
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("%s %s: %w\n%s", filepath.Base(name), strings.Join(args, " "), err, out)
	}
	return string(out), nil
}

// Kubectl runs the cluster's kubectl (see Run).
func (c *Cluster) Kubectl(ctx context.Context, args ...string) (string, error) {
	return c.Run(ctx, filepath.Join(c.opts.BinDir, "kubectl"), args...)
}

// Install installs the release the way docs/install.md tells users to (a
// namespace labelled for privileged pods, then helm install), and waits up
// to 3 minutes until every pod of the release is Ready. A pod in
// CrashLoopBackOff, or one that cannot pull or start its image, fails it
// at once.
func (c *Cluster) Install(ctx context.Context, r Release) error {
	begin := time.Now()
	if _, err := c.Kubectl(ctx, "create", "namespace", r.Namespace); err != nil {
		return err
	}
	if _, err := c.Kubectl(ctx, "label", "namespace", r.Namespace, "pod-security.kubernetes.io/enforce=privileged"); err != nil {
		return err
	}
	for _, o := range r.Objects {
		if _, err := c.RunInput(ctx, o, filepath.Join(c.opts.BinDir, "kubectl"), "apply", "-n", r.Namespace, "-f", "-"); err != nil {
			return err
		}
	}
	args := append([]string{"install", r.Name, r.Chart, "--namespace", r.Namespace}, r.Args...)
	if _, err := c.Run(ctx, r.Helm, args...); err != nil {
		return err
	}
	if err := c.WaitReleaseReady(ctx, r.Namespace, 3*time.Minute); err != nil {
		return err
	}
	fmt.Fprintf(c.opts.Log, "cluster: release %s ready in %.1fs\n", r.Name, time.Since(begin).Seconds())
	return nil
}

// WaitReleaseReady waits until the namespace has pods and all of them run
// and are Ready, and there is no pod of an older revision left terminating.
// A container that waits for a reason no retry changes (ErrImageNeverPull,
// InvalidImageName) ends the wait at once; one that waits for a reason the
// kubelet retries (a Secret its cache has not synced yet, an image pull, a
// crash loop) ends it only once it has waited for that reason for
// stuckWaitingGrace.
func (c *Cluster) WaitReleaseReady(ctx context.Context, namespace string, timeout time.Duration) error {
	cs, err := c.Clientset()
	if err != nil {
		return err
	}
	stuck := stuckWaiting{since: map[string]time.Time{}}
	return c.waitFor(ctx, "the pods of namespace "+namespace+" Ready", "", timeout, func(ctx context.Context) error {
		pods, err := cs.CoreV1().Pods(namespace).List(ctx, metav1.ListOptions{})
		if err != nil {
			return err
		}
		if len(pods.Items) == 0 {
			return fmt.Errorf("no pods in %s yet", namespace)
		}
		now := time.Now()
		for _, p := range pods.Items {
			for _, s := range p.Status.ContainerStatuses {
				if err := stuck.check(now, namespace, p.Name, s); err != nil {
					return err
				}
			}
			if p.DeletionTimestamp != nil {
				return fmt.Errorf("pod %s is terminating", p.Name)
			}
			if !podReady(&p) {
				return fmt.Errorf("pod %s is %s and not Ready", p.Name, p.Status.Phase)
			}
		}
		return nil
	})
}

// stopWaiting wraps an error that no amount of waiting fixes.
type stopWaiting struct{ error }

func (e stopWaiting) Unwrap() error { return e.error }

func podReady(p *corev1.Pod) bool {
	if p.Status.Phase != corev1.PodRunning {
		return false
	}
	for _, cond := range p.Status.Conditions {
		if cond.Type == corev1.PodReady {
			return cond.Status == corev1.ConditionTrue
		}
	}
	return false
}

// Diagnose writes what helps find why a step failed: the nodes and every
// pod, the events of each pod that is not Ready, and the last log lines of
// its containers (the previous run's too after a restart).
func (c *Cluster) Diagnose(ctx context.Context, w io.Writer) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	cs, err := c.Clientset()
	if err != nil {
		fmt.Fprintf(w, "diagnose: %v\n", err)
		return
	}
	if out, err := c.Kubectl(ctx, "get", "nodes,pods", "-A", "-o", "wide"); err == nil {
		fmt.Fprintf(w, "----- nodes and pods\n%s", out)
	} else {
		fmt.Fprintf(w, "diagnose: %v\n", err)
		return
	}
	pods, err := cs.CoreV1().Pods("").List(ctx, metav1.ListOptions{})
	if err != nil {
		fmt.Fprintf(w, "diagnose: listing pods: %v\n", err)
		return
	}
	for _, p := range pods.Items {
		if podReady(&p) {
			continue
		}
		evs, err := cs.CoreV1().Events(p.Namespace).List(ctx, metav1.ListOptions{
			FieldSelector: fields.AndSelectors(fields.OneTermEqualSelector("involvedObject.name", p.Name), fields.OneTermEqualSelector("involvedObject.kind", "Pod")).String(),
		})
		if err == nil {
			fmt.Fprintf(w, "----- events of pod %s/%s\n", p.Namespace, p.Name)
			for _, e := range evs.Items {
				fmt.Fprintf(w, "%s %s %s: %s\n", e.LastTimestamp.Format(time.RFC3339), e.Type, e.Reason, e.Message)
			}
		}
		for _, s := range p.Status.ContainerStatuses {
			for _, previous := range []bool{false, true} {
				if previous && s.RestartCount == 0 {
					continue
				}
				b, err := cs.CoreV1().Pods(p.Namespace).GetLogs(p.Name, &corev1.PodLogOptions{Container: s.Name, Previous: previous, TailLines: ptr(int64(40))}).DoRaw(ctx)
				if err == nil {
					fmt.Fprintf(w, "----- last lines of %s/%s container %s (previous run: %t)\n%s\n", p.Namespace, p.Name, s.Name, previous, b)
				}
			}
		}
	}
}

func ptr[T any](v T) *T { return &v }

// stuckWaitingGrace is how long a container may wait for a reason the
// kubelet retries before a wait for the release gives up on it. A release
// installed again right after its uninstall met its Secret cache not yet
// synced for some seconds; a minute covers that on a busy API server and
// still ends a real fault early.
const stuckWaitingGrace = time.Minute

// stuckWaiting remembers since when each container has waited for the
// reason it waits for now.
type stuckWaiting struct {
	since map[string]time.Time // "pod/container/reason" to the first time seen
}

// check returns a stopWaiting error when the container waits for a reason
// no retry changes, or has waited for a retried one for longer than
// stuckWaitingGrace; a plain error (wait on) while it waits for a retried
// one; nil when it does not wait or waits for another reason
// (ContainerCreating, PodInitializing).
func (s stuckWaiting) check(now time.Time, namespace, pod string, st corev1.ContainerStatus) error {
	w := st.State.Waiting
	if w == nil {
		return nil
	}
	fail := stopWaiting{fmt.Errorf("pod %s/%s: container %s is %s: %s", namespace, pod, st.Name, w.Reason, w.Message)}
	switch w.Reason {
	case "ErrImageNeverPull", "InvalidImageName":
		return fail
	case "CrashLoopBackOff", "ImagePullBackOff", "ErrImagePull", "CreateContainerConfigError", "CreateContainerError":
		key := pod + "/" + st.Name + "/" + w.Reason
		first, ok := s.since[key]
		if !ok {
			s.since[key] = now
			return fail.error
		}
		if now.Sub(first) > stuckWaitingGrace {
			fail.error = fmt.Errorf("%w (for %s)", fail.error, now.Sub(first).Round(time.Second))
			return fail
		}
		return fail.error // retried: waited on, and named if the wait times out
	}
	return nil
}
