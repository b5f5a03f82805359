//go:build linux

package cluster

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	authorizationv1 "k8s.io/api/authorization/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/utils/dump"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/bashtask/bashtask-operator/api/v1alpha1"
	"github.com/bashtask/bashtask-operator/controllers"
	"github.com/bashtask/bashtask-operator/internal/rig/exampletasks"
	"github.com/bashtask/bashtask-operator/internal/rig/registry"
	"github.com/bashtask/bashtask-operator/internal/rig/testutil"
)

// The tests run in this order; the last one uninstalls the release.

// TestExamples: every manifest in examples/ ends with its
// bashtask.dev/expect-reason, as in `make demo`, and the 2 MB stream of
// large-output is whole in the bucket.
func TestExamples(t *testing.T) {
	ns := newNamespace(t)
	expect, err := exampletasks.Apply(t.Context(), k8s, filepath.Join(root, "examples"), ns)
	if err != nil {
		t.Fatal(err)
	}
	if len(expect) < 9 {
		t.Fatalf("found %d example tasks, want at least 9", len(expect))
	}
	waitTaskUntil(t, ns, "long-running", "Running", time.Minute, func(bt *v1.BashTask) bool { return ptr.Deref(bt.Status.Phase, "") == v1.PhaseRunning })
	if _, errOut, code := plugin(t.Context(), "", "-n", ns, "cancel", "long-running"); code != 0 {
		t.Fatalf("kubectl bashtask cancel: exit %d: %s", code, errOut)
	}
	var names []string
	for n := range expect {
		names = append(names, n)
	}
	done := testutil.WaitTerminal(t, k8s, ns, names, 3*time.Minute)
	for _, m := range exampletasks.Mismatches(expect, done) {
		t.Error(m)
	}
	large := waitTaskUntil(t, ns, "large-output", "uploaded", time.Minute, func(bt *v1.BashTask) bool {
		return meta.IsStatusConditionTrue(bt.Status.Conditions, v1.ConditionOutputUploaded)
	})
	if s := large.Status.Stdout; s == nil || !ptr.Deref(s.Truncated, false) || s.Spill == nil || !strings.HasPrefix(ptr.Deref(s.Spill.URL, ""), "file://") {
		t.Fatalf("large-output stdout = %+v, want a truncated tail and a file:// object", s)
	}
	checkObject(t, large, "stdout", large.Status.Stdout)
}

// TestPluginRun: `kubectl bashtask run` reaches the node through the chart's
// controller and agent, with stdin.
func TestPluginRun(t *testing.T) {
	ns := newNamespace(t)
	kernel, err := unameRelease()
	if err != nil {
		t.Fatal(err)
	}
	out, errOut, code := plugin(t.Context(), "", "-n", ns, "run", "--", "uname -r")
	if code != 0 || out != kernel+"\n" {
		t.Errorf("run -- uname -r: exit %d, stdout %q (want %q), stderr %q", code, out, kernel+"\n", errOut)
	}
	out, errOut, code = plugin(t.Context(), "hi\n", "-n", ns, "run", "-i", "--", "cat")
	if code != 0 || out != "hi\n" {
		t.Errorf("echo hi | run -i -- cat: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
}

func unameRelease() (string, error) {
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		return "", err
	}
	return unix.ByteSliceToString(u.Release[:]), nil
}

// TestCgroupContainsEscapees: the agent in its pod creates a cgroup per
// task (status.isolation.mechanism cgroup), so a process that left the
// task's process group with setsid still ends with the task.
func TestCgroupContainsEscapees(t *testing.T) {
	ns := newNamespace(t)
	newTask(t, ns, "escapee", "setsid sleep 300 & echo started")
	bt := testutil.WaitTerminal(t, k8s, ns, []string{"escapee"}, time.Minute)["escapee"]
	if ptr.Deref(bt.Status.Reason, "") != v1.ReasonSucceeded || bt.Status.Stdout == nil || ptr.Deref(bt.Status.Stdout.Tail, "") != "started\n" {
		t.Fatalf("%s, stdout %+v", describe(bt), bt.Status.Stdout)
	}
	if bt.Status.Isolation == nil || ptr.Deref(bt.Status.Isolation.Mechanism, "") != v1.IsolationCgroup {
		t.Errorf("status.isolation = %+v, want mechanism cgroup", bt.Status.Isolation)
	}
	// The task is terminal only after its leftovers were stopped.
	if pids := processesMatching("sleep 300"); len(pids) != 0 {
		t.Errorf("sleep 300 still runs on the node after the task ended: pids %v", pids)
	}
}

// TestUnprivilegedScrubbed: at the chart's default isolation level,
// tenant, the task runs as a UID of its own leased from
// agent.taskUIDRange, never root, in namespaces of its own, under the
// image's bashtask-shim, and sees none of the agent's bucket credentials.
func TestUnprivilegedScrubbed(t *testing.T) {
	ns := newNamespace(t)
	newTask(t, ns, "whoami", "id -u; id -g; env")
	bt := testutil.WaitTerminal(t, k8s, ns, []string{"whoami"}, time.Minute)["whoami"]
	if ptr.Deref(bt.Status.Reason, "") != v1.ReasonSucceeded || bt.Status.Stdout == nil {
		t.Fatalf("%s", describe(bt))
	}
	iso := bt.Status.Isolation
	if iso == nil || ptr.Deref(iso.Level, "") != v1.IsolationLevelTenant || !slices.Contains(iso.Namespaces, "pid") || !slices.Contains(iso.Namespaces, "mnt") {
		t.Fatalf("status.isolation = %s, want level tenant with pid and mnt namespaces (the chart's default)", dump.OneLine(iso))
	}
	// The chart's default agent.taskUIDRange.
	const firstUID, lastUID = 2000000, 2065535
	uid := ptr.Deref(iso.User, -1)
	lines := strings.Split(ptr.Deref(bt.Status.Stdout.Tail, ""), "\n")
	want := strconv.FormatInt(uid, 10)
	if uid < firstUID || uid > lastUID || len(lines) < 2 || lines[0] != want || lines[1] != want {
		t.Errorf("uid and gid %q, status.isolation.user %d; want both equal to the user, leased from %d-%d", lines[:min(2, len(lines))], uid, firstUID, lastUID)
	}
	env := ptr.Deref(bt.Status.Stdout.Tail, "")
	for _, leak := range []string{"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", bucketKeyID, bucketSecret} {
		if strings.Contains(env, leak) {
			t.Errorf("the task's environment holds %q from the agent's bucket credentials", leak)
		}
	}
	// The task's shim is the image's static bashtask-shim, not the agent's
	// own binary (docs/agent.md, --shim-path).
	// The chart's agent logs JSON; text has key=value.
	if logs := kubectl(t, "-n", releaseNS, "logs", agentPod(t)); !strings.Contains(logs, `"shim":"/usr/local/bin/bashtask-shim"`) &&
		!strings.Contains(logs, "shim=/usr/local/bin/bashtask-shim ") {
		t.Errorf("the agent's log does not name /usr/local/bin/bashtask-shim as the shim: %q", firstLine(logs, "executor ready"))
	}
	// The agent itself does have them: the scrub is what kept them out.
	agentEnv := kubectl(t, "-n", releaseNS, "exec", agentPod(t), "--", "printenv", "AWS_SECRET_ACCESS_KEY")
	if strings.TrimSpace(agentEnv) != bucketSecret {
		t.Errorf("the agent's AWS_SECRET_ACCESS_KEY is %q; the test's premise is that the agent has it", agentEnv)
	}
}

// TestFullStreamInBucket: more output than the tail keeps, whole in the
// configured bucket (a file bucket on the node's hostPath), sha256 equal to
// the status.
func TestFullStreamInBucket(t *testing.T) {
	ns := newNamespace(t)
	newTask(t, ns, "seq", "seq 1 200000")
	bt := waitTaskUntil(t, ns, "seq", "uploaded", 2*time.Minute, func(bt *v1.BashTask) bool {
		return meta.IsStatusConditionTrue(bt.Status.Conditions, v1.ConditionOutputUploaded)
	})
	if s := bt.Status.Stdout; ptr.Deref(bt.Status.Reason, "") != v1.ReasonSucceeded || s == nil || ptr.Deref(s.TotalBytes, 0) != 1288895 || !ptr.Deref(s.Truncated, false) || s.Spill == nil || !ptr.Deref(s.Spill.Complete, false) {
		t.Fatalf("%s, stdout %+v", describe(bt), bt.Status.Stdout)
	}
	checkObject(t, bt, "stdout", bt.Status.Stdout)
	// The plugin reads through the output API. Once the agent has
	// forgotten the task, its stream is only in this rig's bucket, the
	// chart's default file:// on the node, which the controller cannot
	// read: the node's agent serves the uploaded copy (as in
	// TestOutputAPI).
	waitForgotten(t, bt)
	out, errOut, code := plugin(t.Context(), "", "-n", ns, "logs", "--full", "seq")
	if code != 0 || len(out) != 1288895 || !strings.HasSuffix(out, "\n200000\n") {
		t.Errorf("logs --full: exit %d, %d bytes, stderr %q; want 0 and every byte", code, len(out), errOut)
	}
}

// The images of docs/images.md on a real cluster: the agent in its pod
// pulls from the in-cluster registry (internal/rig/nodecluster, a
// Service's ClusterIP, plain HTTP) and runs the tasks in the image.

// TestWorkspaceInImage: a BashWorkspace naming task-small in the
// in-cluster registry becomes Ready with the pushed digest in
// status.image.digest and ImagePulled True; its tasks run in the image
// (BusyBox is there, python3 is not), and a file a task writes under /etc
// is there for the next task.
func TestWorkspaceInImage(t *testing.T) {
	ns := newNamespace(t)
	ws := newImageWorkspace(t, ns, "small", taskSmallRef)
	got := waitWorkspaceUntil(t, ws, "Ready", 3*time.Minute, func(ws *v1.BashWorkspace) bool {
		return ptr.Deref(ws.Status.Phase, "") == v1.WorkspaceReady
	})
	if im := got.Status.Image; im == nil || ptr.Deref(im.Digest, "") != digests[taskSmallRef] || ptr.Deref(im.Requested, "") != taskSmallRef {
		t.Errorf("status.image = %s, want %s resolved to %s", dump.OneLine(got.Status.Image), taskSmallRef, digests[taskSmallRef])
	}
	if c := meta.FindStatusCondition(got.Status.Conditions, v1.ConditionImagePulled); c == nil || c.Status != metav1.ConditionTrue {
		t.Errorf("condition ImagePulled = %s, want True", dump.OneLine(c))
	}
	first := runInWorkspace(t, ns, "first", ws.Name,
		`test -x /bin/busybox && echo busybox; command -v python3 || echo no-python3; echo kept > /etc/bashtask-marker`)
	if out := ptr.Deref(first.Status.Stdout.Tail, ""); out != "busybox\nno-python3\n" {
		t.Errorf("the first task's stdout is %q, want BusyBox and no python3 (the task-small image)", out)
	}
	second := runInWorkspace(t, ns, "second", ws.Name, `cat /etc/bashtask-marker`)
	if out := ptr.Deref(second.Status.Stdout.Tail, ""); out != "kept\n" {
		t.Errorf("the second task's stdout is %q, want the file the first wrote under /etc", out)
	}
}

// TestPrivateImagePullSecret: a repository that wants credentials is
// pulled with the workspace's spec.imagePullSecrets; without them the
// workspace fails ImageUnauthorized.
func TestPrivateImagePullSecret(t *testing.T) {
	ns := newNamespace(t)
	secret := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "registry-credentials"},
		Type:       corev1.SecretTypeDockerConfigJson,
		Data:       map[string][]byte{corev1.DockerConfigJsonKey: registry.TestDockerConfigJSON(registryHost)},
	}
	if err := k8s.Create(t.Context(), secret); err != nil {
		t.Fatal(err)
	}
	with := newImageWorkspace(t, ns, "with-secret", privateRef, secret.Name)
	without := newImageWorkspace(t, ns, "without-secret", privateRef)
	got := waitWorkspaceUntil(t, with, "Ready", 3*time.Minute, func(ws *v1.BashWorkspace) bool {
		return ptr.Deref(ws.Status.Phase, "") == v1.WorkspaceReady
	})
	if im := got.Status.Image; im == nil || ptr.Deref(im.Digest, "") != digests[privateRef] {
		t.Errorf("status.image = %s, want the digest %s", dump.OneLine(got.Status.Image), digests[privateRef])
	}
	failed := waitWorkspaceUntil(t, without, "Failed", 3*time.Minute, func(ws *v1.BashWorkspace) bool {
		return ptr.Deref(ws.Status.Phase, "") == v1.WorkspaceFailed
	})
	if c := meta.FindStatusCondition(failed.Status.Conditions, v1.ConditionReady); c == nil || c.Reason != string(v1.ReasonImageUnauthorized) {
		t.Errorf("condition Ready = %s, want reason %s", dump.OneLine(c), v1.ReasonImageUnauthorized)
	}
}

// TestDefaultImagePython: a task that names no image runs in the chart's
// default image (agent.images.defaultImage, here the in-cluster copy of
// the Task image), so the docs' python3 examples work on the defaults.
func TestDefaultImagePython(t *testing.T) {
	ns := newNamespace(t)
	newTask(t, ns, "python", `python3 -c 'print(6*7)'`)
	bt := testutil.WaitTerminal(t, k8s, ns, []string{"python"}, 2*time.Minute)["python"]
	if ptr.Deref(bt.Status.Reason, "") != v1.ReasonSucceeded || bt.Status.Stdout == nil || ptr.Deref(bt.Status.Stdout.Tail, "") != "42\n" {
		t.Fatalf("%s, stdout %s", describe(bt), dump.OneLine(bt.Status.Stdout))
	}
	if im := bt.Status.Image; im == nil || ptr.Deref(im.Requested, "") != taskRef || ptr.Deref(im.Digest, "") != digests[taskRef] {
		t.Errorf("status.image = %s, want %s resolved to %s", dump.OneLine(bt.Status.Image), taskRef, digests[taskRef])
	}
}

// TestOutputAPI: the chart registers the controller's aggregated API
// (docs/install.md, "The output API") and the cluster's kube-apiserver
// proxies to it through its front proxy: the APIService becomes
// Available; kubectl get --raw of a finished task's bashtasks/log returns
// its streams byte for byte (sha256 equal to the status; the stdout that
// went to the bucket, the stderr that did not), from an offset and up to
// a limit; a user bound to view reads it, a user without RBAC gets 403;
// and `kubectl get bashtasks` still means the CRD.
func TestOutputAPI(t *testing.T) {
	// What the rig and the chart set up, each checked on its own so a
	// failure says which side is missing.
	t.Run("front proxy published", func(t *testing.T) {
		cm, err := cs.CoreV1().ConfigMaps("kube-system").Get(t.Context(), "extension-apiserver-authentication", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(cm.Data["requestheader-client-ca-file"], "BEGIN CERTIFICATE") ||
			!strings.Contains(cm.Data["requestheader-allowed-names"], "front-proxy-client") ||
			!strings.Contains(cm.Data["requestheader-username-headers"], "X-Remote-User") {
			t.Errorf("kube-system/extension-apiserver-authentication lacks the front proxy's settings: %v", keysOf(cm.Data))
		}
	})
	t.Run("delegation RBAC", func(t *testing.T) {
		sa := "system:serviceaccount:" + releaseNS + ":" + releaseName + "-controller"
		for _, attrs := range []authorizationv1.ResourceAttributes{
			{Verb: "create", Group: "authentication.k8s.io", Resource: "tokenreviews"},
			{Verb: "create", Group: "authorization.k8s.io", Resource: "subjectaccessreviews"},
			{Verb: "get", Resource: "configmaps", Namespace: "kube-system", Name: "extension-apiserver-authentication"},
		} {
			sar := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
				User: sa, Groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + releaseNS, "system:authenticated"},
				ResourceAttributes: &attrs,
			}}
			got, err := cs.AuthorizationV1().SubjectAccessReviews().Create(t.Context(), sar, metav1.CreateOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if !got.Status.Allowed {
				t.Errorf("%s may not %s %s %s/%s: %s", sa, attrs.Verb, attrs.Group, attrs.Resource, attrs.Name, got.Status.Reason)
			}
		}
	})
	ns := newNamespace(t)
	t.Run("view, edit and admin include bashtasks/log", func(t *testing.T) {
		for _, role := range []string{"view", "edit", "admin"} {
			user := "output-" + role
			bindRole(t, ns, role, user)
			// kube-controller-manager aggregates the chart's ClusterRole
			// into view (and view into edit and admin) asynchronously.
			testutil.WaitFor(t, user+" (bound to "+role+") may get bashtasks/log", time.Minute, func() error {
				if !allowed(t, user, ns) {
					return fmt.Errorf("denied")
				}
				return nil
			})
		}
		if allowed(t, "someone", ns) {
			t.Errorf("someone, bound to nothing, may get bashtasks/log")
		}
	})

	u := &unstructured.Unstructured{}
	u.SetAPIVersion("apiregistration.k8s.io/v1")
	u.SetKind("APIService")
	if err := k8s.Get(t.Context(), client.ObjectKey{Name: outputAPIService}, u); err != nil {
		t.Fatalf("the chart's APIService: %v", err)
	}
	if svc, _, _ := unstructured.NestedString(u.Object, "spec", "service", "name"); svc == "" {
		t.Fatalf("APIService %s has no service: %v", outputAPIService, u.Object["spec"])
	}
	testutil.WaitFor(t, "APIService "+outputAPIService+" Available", 2*time.Minute, func() error {
		if err := k8s.Get(t.Context(), client.ObjectKey{Name: outputAPIService}, u); err != nil {
			return err
		}
		conds, _, _ := unstructured.NestedSlice(u.Object, "status", "conditions")
		for _, c := range conds {
			c, _ := c.(map[string]any)
			if c["type"] == "Available" {
				if c["status"] == "True" {
					return nil
				}
				return fmt.Errorf("Available=%v: %v: %v", c["status"], c["reason"], c["message"])
			}
		}
		return fmt.Errorf("no Available condition yet")
	})

	newTask(t, ns, "seq", "seq 1 200000; echo done >&2")
	bt := waitTaskUntil(t, ns, "seq", "finished and uploaded", 2*time.Minute, func(bt *v1.BashTask) bool {
		return ptr.Deref(bt.Status.Reason, "") != "" && meta.IsStatusConditionTrue(bt.Status.Conditions, v1.ConditionOutputUploaded)
	})
	if ptr.Deref(bt.Status.Reason, "") != v1.ReasonSucceeded || bt.Status.Stdout == nil || bt.Status.Stderr == nil {
		t.Fatalf("%s", describe(bt))
	}
	// Once the agent forgot the task, its stdout is only in the bucket,
	// the chart's default file:// on the node, which the controller cannot
	// read (it has no --output-bucket-url): the node's agent serves its
	// uploaded copy.
	waitForgotten(t, bt)
	var want bytes.Buffer
	for i := 1; i <= 200000; i++ {
		fmt.Fprintf(&want, "%d\n", i)
	}
	read := func(t *testing.T, query string, as ...string) []byte {
		t.Helper()
		args := append([]string{"get", "--raw", logPath(ns, "seq", query)}, as...)
		out, errOut, err := kubectlOut(t.Context(), args...)
		if err != nil {
			t.Fatalf("kubectl %s: %v: %s", strings.Join(args, " "), err, errOut)
		}
		return out
	}
	checkStream := func(t *testing.T, name string, got []byte, s *v1.StreamStatus) {
		t.Helper()
		sum := sha256.Sum256(got)
		if int64(len(got)) != ptr.Deref(s.TotalBytes, -1) || hex.EncodeToString(sum[:]) != ptr.Deref(s.SHA256, "") {
			t.Errorf("%s through the API: %d bytes sha256 %x; status: %d bytes sha256 %s",
				name, len(got), sum, ptr.Deref(s.TotalBytes, -1), ptr.Deref(s.SHA256, ""))
		}
	}

	t.Run("stdout whole", func(t *testing.T) {
		got := read(t, "")
		checkStream(t, "stdout", got, bt.Status.Stdout)
		if !bytes.Equal(got, want.Bytes()) {
			t.Errorf("stdout through the API differs from seq 1 200000's %d bytes", want.Len())
		}
	})
	t.Run("stderr", func(t *testing.T) {
		got := read(t, "stream=stderr")
		checkStream(t, "stderr", got, bt.Status.Stderr)
		if string(got) != "done\n" {
			t.Errorf("stderr through the API %q, want %q", got, "done\n")
		}
	})
	t.Run("offset and limitBytes", func(t *testing.T) {
		const offset, limit = 1000000, 4096
		got := read(t, fmt.Sprintf("stream=stdout&offset=%d&limitBytes=%d", offset, limit))
		if !bytes.Equal(got, want.Bytes()[offset:offset+limit]) {
			t.Errorf("offset %d limitBytes %d: got %d bytes %.40q..., want %.40q...", offset, limit, len(got), got, want.Bytes()[offset:])
		}
	})
	t.Run("a viewer reads it", func(t *testing.T) {
		got := read(t, "stream=stderr", "--as=output-view")
		if string(got) != "done\n" {
			t.Errorf("as output-view: %q", got)
		}
	})
	t.Run("no RBAC, 403", func(t *testing.T) {
		out, errOut, err := kubectlOut(t.Context(), "get", "--raw", logPath(ns, "seq", ""), "--as=someone")
		if err == nil || !strings.Contains(errOut, "Forbidden") {
			t.Errorf("as someone: error %v, stderr %q, %d bytes of output; want Forbidden", err, errOut, len(out))
		}
		if len(out) > 0 {
			t.Errorf("as someone: %d bytes of the task's output", len(out))
		}
	})
	t.Run("bashtasks still means the CRD", func(t *testing.T) {
		out := kubectl(t, "get", "bashtasks", "-n", ns, "-o", "jsonpath={.items[*].apiVersion}")
		if strings.TrimSpace(out) != "bashtask.dev/v1alpha1" {
			t.Errorf("kubectl get bashtasks lists %q, want the CRD's bashtask.dev/v1alpha1", out)
		}
	})
}

// TestAgentPodDeleted: deleting the agent's pod while a task runs; the
// DaemonSet's new pod finds the task in the hostPath state directory,
// reports it AgentRestarted with the output captured so far, and uploads
// it whole.
func TestAgentPodDeleted(t *testing.T) {
	ns := newNamespace(t)
	newTask(t, ns, "long", "seq 1 100000; sleep 60")
	waitTaskUntil(t, ns, "long", "with all its output", time.Minute, func(bt *v1.BashTask) bool {
		return bt.Status.Stdout != nil && ptr.Deref(bt.Status.Stdout.TotalBytes, 0) == 588895
	})
	old := agentPod(t)
	kubectl(t, "-n", releaseNS, "delete", "pod", old, "--wait=false")
	bt := waitTaskUntil(t, ns, "long", "AgentRestarted and uploaded", 3*time.Minute, func(bt *v1.BashTask) bool {
		return ptr.Deref(bt.Status.Reason, "") != "" && meta.IsStatusConditionTrue(bt.Status.Conditions, v1.ConditionOutputUploaded)
	})
	if ptr.Deref(bt.Status.Reason, "") != v1.ReasonAgentRestarted {
		t.Fatalf("%s, want AgentRestarted", describe(bt))
	}
	if s := bt.Status.Stdout; s == nil || ptr.Deref(s.TotalBytes, 0) != 588895 || s.Spill == nil || !ptr.Deref(s.Spill.Complete, false) {
		t.Fatalf("stdout %+v, want 588895 bytes stored complete", s)
	}
	checkObject(t, bt, "stdout", bt.Status.Stdout)
	if now := agentPod(t); now == old {
		t.Errorf("the agent pod is still %s", old)
	}
	waitNoProcess(t, "sleep 60", 30*time.Second)
}

// TestCordon: after `kubectl cordon` of the only node, a new task waits
// Pending with Scheduled=False/NodeUnschedulable while the agent's pod
// (which tolerates the cordon) keeps running, and a task that ran before
// the cordon finishes; `kubectl uncordon` dispatches the waiting task.
func TestCordon(t *testing.T) {
	ns := newNamespace(t)
	node := cluster.NodeName()
	t.Cleanup(func() { _, _ = cluster.Kubectl(context.Background(), "uncordon", node) })
	newTask(t, ns, "before", countingCommand("sleep 20"))
	waitTaskUntil(t, ns, "before", "running", time.Minute, func(bt *v1.BashTask) bool {
		return ptr.Deref(bt.Status.Phase, "") == v1.PhaseRunning
	})
	kubectl(t, "cordon", node)
	newTask(t, ns, "after", countingCommand("true"))
	waiting := waitTaskUntil(t, ns, "after", "waiting for the cordoned node", time.Minute, func(bt *v1.BashTask) bool {
		c := meta.FindStatusCondition(bt.Status.Conditions, v1.ConditionScheduled)
		return c != nil && c.Reason == controllers.ReasonNodeUnschedulable
	})
	if c := meta.FindStatusCondition(waiting.Status.Conditions, v1.ConditionScheduled); !strings.Contains(c.Message, "node "+node+" is cordoned") || waiting.Status.NodeName != nil {
		t.Fatalf("the waiting task: %s", describe(waiting))
	}
	if before := waitTaskUntil(t, ns, "before", "present", time.Minute, func(*v1.BashTask) bool { return true }); ptr.Deref(before.Status.Reason, "") != "" {
		t.Fatalf("the first task ended before the cordon was seen, which checks nothing: %s", describe(before))
	}
	done := testutil.WaitTerminal(t, k8s, ns, []string{"before"}, time.Minute)["before"]
	if ptr.Deref(done.Status.Reason, "") != v1.ReasonSucceeded {
		t.Errorf("the task that ran before the cordon: %s", describe(done))
	}
	if n := countRuns(t)[string(waiting.UID)]; n != 0 {
		t.Fatalf("the task ran on the cordoned node %d times", n)
	}
	agentPod(t) // the agent still runs on the cordoned node

	kubectl(t, "uncordon", node)
	got := testutil.WaitTerminal(t, k8s, ns, []string{"after"}, time.Minute)["after"]
	if ptr.Deref(got.Status.Reason, "") != v1.ReasonSucceeded || ptr.Deref(got.Status.NodeName, "") != node {
		t.Errorf("after uncordon: %s", describe(got))
	}
}

// TestControllerPodDeleted: deleting the controller's pod while 20 tasks
// run; the Deployment's new pod takes the Lease and every task ends
// Succeeded, each command run once.
func TestControllerPodDeleted(t *testing.T) {
	ns := newNamespace(t)
	var names []string
	for i := range 20 {
		names = append(names, fmt.Sprintf("sleep-%02d", i))
		newTask(t, ns, names[i], countingCommand("sleep 5"))
	}
	// The agent runs 16 at a time (agent.maxConcurrentTasks); the other
	// four wait for a slot.
	deadline := time.Now().Add(time.Minute)
	for running := 0; running < 16; {
		var list v1.BashTaskList
		if err := k8s.List(t.Context(), &list, client.InNamespace(ns)); err != nil {
			t.Fatal(err)
		}
		running = 0
		for i := range list.Items {
			if ptr.Deref(list.Items[i].Status.Phase, "") == v1.PhaseRunning {
				running++
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of 20 tasks Running after a minute, want 16", running)
		}
		time.Sleep(100 * time.Millisecond)
	}
	old := podOf(t, "controller")
	kubectl(t, "-n", releaseNS, "delete", "pod", old, "--wait=false")
	done := testutil.WaitTerminal(t, k8s, ns, names, 3*time.Minute)
	runs := countRuns(t)
	for _, n := range names {
		bt := done[n]
		if ptr.Deref(bt.Status.Reason, "") != v1.ReasonSucceeded {
			t.Errorf("%s", describe(bt))
		}
		if c := runs[string(bt.UID)]; c != 1 {
			t.Errorf("%s ran %d times, want once", n, c)
		}
	}
	now := podOf(t, "controller")
	if now == old {
		t.Fatalf("the controller pod is still %s", old)
	}
	lease := &coordinationv1.Lease{}
	deadline = time.Now().Add(time.Minute)
	for {
		if err := k8s.Get(t.Context(), client.ObjectKey{Namespace: releaseNS, Name: "bashtask-controller.bashtask.dev"}, lease); err != nil {
			t.Fatal(err)
		}
		if lease.Spec.HolderIdentity != nil && strings.HasPrefix(*lease.Spec.HolderIdentity, now) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the Lease is held by %v, not by the new pod %s", ptr.Deref(lease.Spec.HolderIdentity, "nobody"), now)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// TestHelmUpgradeRollsAgents: `helm upgrade --set
// agent.maxConcurrentTasks=8` replaces the agent pod while tasks run and
// arrive; none is lost or run twice.
func TestHelmUpgradeRollsAgents(t *testing.T) {
	ns := newNamespace(t)
	old := agentPod(t)
	var names []string
	for i := range 10 {
		names = append(names, fmt.Sprintf("before-%02d", i))
		newTask(t, ns, names[len(names)-1], countingCommand("sleep 2"))
	}
	args := append([]string{"upgrade", releaseName, filepath.Join(root, "charts", "bashtask"), "--namespace", releaseNS}, releaseArgs()...)
	helm(t, append(args, "--set", "agent.maxConcurrentTasks=8")...)
	for i := range 10 {
		names = append(names, fmt.Sprintf("during-%02d", i))
		newTask(t, ns, names[len(names)-1], countingCommand("sleep 1"))
		time.Sleep(300 * time.Millisecond)
	}
	if err := cluster.WaitReleaseReady(t.Context(), releaseNS, 3*time.Minute); err != nil {
		t.Fatal(err)
	}
	now := agentPod(t)
	if now == old {
		t.Fatalf("the agent pod %s was not replaced", old)
	}
	ds := kubectl(t, "-n", releaseNS, "get", "pod", now, "-o", "jsonpath={.spec.containers[0].args}")
	if !strings.Contains(ds, "--max-concurrent-tasks=8") {
		t.Errorf("the new agent runs with %s, want --max-concurrent-tasks=8", ds)
	}
	done := testutil.WaitTerminal(t, k8s, ns, names, 3*time.Minute)
	runs := countRuns(t)
	reasons := map[v1.Reason]int{}
	for _, n := range names {
		bt := done[n]
		reasons[ptr.Deref(bt.Status.Reason, "")]++
		c := runs[string(bt.UID)]
		switch {
		case c > 1:
			t.Errorf("%s ran %d times", n, c)
		case c == 0 && ptr.Deref(bt.Status.Reason, "") != v1.ReasonAgentLost && ptr.Deref(bt.Status.Reason, "") != v1.ReasonAgentRestarted:
			// A task the old agent had not started yet may end without
			// running only as lost with its agent; nothing else.
			t.Errorf("%s never ran but ended %s", n, ptr.Deref(bt.Status.Reason, ""))
		}
	}
	t.Logf("outcomes across the roll: %v", reasons)
}

// TestNamespaceDeletion: deleting a namespace that holds a running task
// stops its processes, releases the finalizer, and the namespace goes away.
func TestNamespaceDeletion(t *testing.T) {
	ns := newNamespace(t)
	newTask(t, ns, "in-doomed-namespace", "sleep 302")
	waitTaskUntil(t, ns, "in-doomed-namespace", "Running", time.Minute, func(bt *v1.BashTask) bool { return ptr.Deref(bt.Status.Phase, "") == v1.PhaseRunning })
	if len(processesMatching("sleep 302")) != 1 {
		t.Fatalf("want one sleep 302 on the node, have %v", processesMatching("sleep 302"))
	}
	kubectl(t, "delete", "namespace", ns, "--wait=false")
	waitNoProcess(t, "sleep 302", 30*time.Second)
	deadline := time.Now().Add(2 * time.Minute)
	for {
		_, err := cs.CoreV1().Namespaces().Get(t.Context(), ns, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("namespace %s still there after 2 minutes (%v): %s", ns, err, kubectl(t, "get", "bashtasks", "-n", ns, "-o", "yaml"))
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// TestHelmUninstall: `helm uninstall` with tasks still running stops them,
// leaves no task process on the node and no task that cannot be deleted;
// the CRD stays (Helm never deletes the CRDs of a chart's crds/). The
// release is installed again at its end, so that the tests after it
// (go test runs them in file order) find it.
func TestHelmUninstall(t *testing.T) {
	ns := newNamespace(t)
	t.Cleanup(func() { reinstall(t) })
	newTask(t, ns, "running-at-uninstall", "sleep 303")
	newTask(t, ns, "finished-before", "true")
	waitTaskUntil(t, ns, "running-at-uninstall", "Running", time.Minute, func(bt *v1.BashTask) bool { return ptr.Deref(bt.Status.Phase, "") == v1.PhaseRunning })
	testutil.WaitTerminal(t, k8s, ns, []string{"finished-before"}, time.Minute)
	helm(t, "uninstall", releaseName, "--namespace", releaseNS, "--wait", "--timeout", "3m")
	waitNoProcess(t, "sleep 303", 30*time.Second)
	bt := testutil.WaitTerminal(t, k8s, ns, []string{"running-at-uninstall"}, 30*time.Second)["running-at-uninstall"]
	if ptr.Deref(bt.Status.Reason, "") != v1.ReasonCancelled {
		t.Errorf("%s, want Cancelled by the uninstall", describe(bt))
	}
	// Nothing is left to remove a finalizer: deleting the tasks must not
	// hang.
	kubectl(t, "delete", "bashtasks", "--all", "-n", ns, "--timeout=30s")
	var list v1.BashTaskList
	if err := k8s.List(t.Context(), &list, client.InNamespace(ns)); err != nil || len(list.Items) != 0 {
		t.Errorf("tasks left after delete: %d (%v)", len(list.Items), err)
	}
	if out := kubectl(t, "get", "crd", "bashtasks.bashtask.dev", "-o", "name"); strings.TrimSpace(out) == "" {
		t.Errorf("the CRD is gone; Helm keeps the CRDs of crds/")
	}
	// The workloads' pods go with their owners (the garbage collector),
	// after helm uninstall returned.
	deadline := time.Now().Add(2 * time.Minute)
	for {
		pods := kubectl(t, "get", "pods", "-n", releaseNS, "-o", "name")
		if strings.TrimSpace(pods) == "" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("pods left in %s 2 minutes after helm uninstall: %s", releaseNS, pods)
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// reinstall installs the suite's release again after TestHelmUninstall,
// with the values of the first install, and waits until its pods are
// Ready. It runs at cleanup, when the test's context is already done.
func reinstall(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	args := append([]string{"install", releaseName, filepath.Join(root, "charts", "bashtask"), "--namespace", releaseNS}, releaseArgs()...)
	if _, err := cluster.Run(ctx, filepath.Join(root, "bin", "helm"), args...); err != nil {
		t.Fatalf("installing the release again: %v", err)
	}
	if err := cluster.WaitReleaseReady(ctx, releaseNS, 3*time.Minute); err != nil {
		t.Fatalf("the release installed again: %v", err)
	}
}
