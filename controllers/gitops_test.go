package controllers_test

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	. "github.com/onsi/gomega"
	lua "github.com/yuin/gopher-lua"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/utils/dump"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/cli-utils/pkg/kstatus/status"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/bashtask/bashtask-operator/api/v1alpha1"
	"github.com/bashtask/bashtask-operator/controllers"
	"github.com/bashtask/bashtask-operator/internal/rig/testenv"
)

// holdFinalizer keeps a deleted task in Terminating for as long as a test
// needs to read it.
const holdFinalizer = "test.bashtask.dev/hold"

// phaseView is what GitOps tools see of a task at one phase: its kstatus
// conditions, the kstatus status and the Argo CD health.
type phaseView struct {
	Conditions string // Ready, Reconciling, Stalled as Type=Status/Reason
	KStatus    status.Status
	Health     string // Argo CD health status from docs/gitops/argocd/health.lua
}

// TestGitOpsView reads tasks back from the API server at every phase and
// checks their kstatus conditions, what kstatus status.Compute makes of
// them (C37) and what the shipped Argo CD health script makes of them.
func TestGitOpsView(t *testing.T) {
	ns := newNamespace(t)
	script, err := readHealthScript()
	if err != nil {
		t.Fatal(err)
	}
	g := NewWithT(t)
	secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "nul"}, Data: map[string][]byte{"v": []byte("a\x00b")}}
	g.Expect(k8s.Create(t.Context(), secret)).To(Succeed())
	held := &v1.BashWorkspace{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "held"}, Spec: v1.BashWorkspaceSpec{Suspend: ptr.To(true)}}
	g.Expect(k8s.Create(t.Context(), held)).To(Succeed())

	type phase struct {
		task  *v1.BashTask
		ready func(*v1.BashTask) bool // the task has reached the phase
		after func(*testing.T, *v1.BashTask)
		want  phaseView
	}
	terminal := func(reason v1.Reason) func(*v1.BashTask) bool {
		return func(bt *v1.BashTask) bool { return ptr.Deref(bt.Status.Reason, "") == reason }
	}
	scheduled := func(reason string) func(*v1.BashTask) bool {
		return func(bt *v1.BashTask) bool {
			c := meta.FindStatusCondition(bt.Status.Conditions, v1.ConditionScheduled)
			return c != nil && c.Reason == reason
		}
	}
	running := func(bt *v1.BashTask) bool { return ptr.Deref(bt.Status.Phase, "") == v1.PhaseRunning }
	phases := map[string]*phase{
		"pending (no agent)": {
			task:  newTask(ns, "pending", "true", func(bt *v1.BashTask) { bt.Spec.NodeSelector = map[string]string{"zone": "mars"} }),
			ready: scheduled("NoAgent"),
			want:  phaseView{"Ready=False/Pending Reconciling=True/Pending", status.InProgressStatus, "Progressing"},
		},
		"suspended": {
			task:  newTask(ns, "suspended", "true", func(bt *v1.BashTask) { bt.Spec.Suspend = ptr.To(true) }),
			ready: scheduled("Suspended"),
			want:  phaseView{"Ready=False/Suspended Reconciling=True/Suspended", status.InProgressStatus, "Suspended"},
		},
		"running": {
			task:  newTask(ns, "running", "sleep 60"),
			ready: running,
			want:  phaseView{"Ready=False/Running Reconciling=True/Running", status.InProgressStatus, "Progressing"},
		},
		"succeeded": {
			task:  newTask(ns, "succeeded", "true"),
			ready: terminal(v1.ReasonSucceeded),
			want:  phaseView{"Ready=True/Succeeded", status.CurrentStatus, "Healthy"},
		},
		"failed NonZeroExit": {
			task:  newTask(ns, "nonzero", "exit 3"),
			ready: terminal(v1.ReasonNonZeroExit),
			want:  phaseView{"Ready=False/NonZeroExit Stalled=True/NonZeroExit", status.FailedStatus, "Degraded"},
		},
		"failed Signaled": {
			task:  newTask(ns, "signaled", "kill -TERM $$"),
			ready: terminal(v1.ReasonSignaled),
			want:  phaseView{"Ready=False/Signaled Stalled=True/Signaled", status.FailedStatus, "Degraded"},
		},
		"failed TimedOut": {
			task:  newTask(ns, "timedout", "sleep 30", func(bt *v1.BashTask) { bt.Spec.TimeoutSeconds = ptr.To[int32](1) }),
			ready: terminal(v1.ReasonTimedOut),
			want:  phaseView{"Ready=False/TimedOut Stalled=True/TimedOut", status.FailedStatus, "Degraded"},
		},
		"failed Cancelled": {
			task:  newTask(ns, "cancelled", "sleep 60"),
			ready: running,
			after: func(t *testing.T, bt *v1.BashTask) {
				cancelTask(t, bt)
				waitTerminal(t, bt)
			},
			want: phaseView{"Ready=False/Cancelled Stalled=True/Cancelled", status.FailedStatus, "Degraded"},
		},
		"failed StartFailed": {
			task:  newTask(ns, "startfailed", "true", func(bt *v1.BashTask) { bt.Spec.WorkingDir = ptr.To("/does/not/exist") }),
			ready: terminal(v1.ReasonStartFailed),
			want:  phaseView{"Ready=False/StartFailed Stalled=True/StartFailed", status.FailedStatus, "Degraded"},
		},
		"failed InvalidSpec": {
			task: newTask(ns, "invalid", "true", func(bt *v1.BashTask) {
				bt.Spec.Env = []v1.EnvVar{{Name: "V", ValueFrom: &v1.ValueSource{SecretKeyRef: &v1.KeySelector{Name: "nul", Key: "v"}}}}
			}),
			ready: terminal(v1.ReasonInvalidSpec),
			want:  phaseView{"Ready=False/InvalidSpec Stalled=True/InvalidSpec", status.FailedStatus, "Degraded"},
		},
		"failed WorkspaceUnavailable": {
			task:  newTask(ns, "unavailable", "true", func(bt *v1.BashTask) { bt.Spec.Workspace = ptr.To("held") }),
			ready: terminal(v1.ReasonWorkspaceUnavailable),
			want:  phaseView{"Ready=False/WorkspaceUnavailable Stalled=True/WorkspaceUnavailable", status.FailedStatus, "Degraded"},
		},
		"deleted while running, finalizer pending": {
			task:  newTask(ns, "terminating", "sleep 60", func(bt *v1.BashTask) { bt.Finalizers = []string{holdFinalizer} }),
			ready: running,
			after: func(t *testing.T, bt *v1.BashTask) {
				if err := k8s.Delete(t.Context(), bt); err != nil {
					t.Fatal(err)
				}
				// The controller cancels the task and drops its own
				// finalizer; the test's keeps the object.
				NewWithT(t).Eventually(func(g Gomega) {
					got := get(g, bt)
					g.Expect(got.Status.Reason).To(HaveValue(Equal(v1.ReasonCancelled)))
					g.Expect(got.Finalizers).To(Equal([]string{holdFinalizer}))
				}).WithTimeout(waitLong).Should(Succeed())
			},
			want: phaseView{"Ready=False/Cancelled Stalled=True/Cancelled", status.TerminatingStatus, "Degraded"},
		},
	}
	for _, p := range phases {
		create(t, p.task)
	}
	t.Cleanup(func() {
		for _, name := range []string{"running", "terminating"} {
			bt := &v1.BashTask{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
			_ = k8s.Patch(ctxBackground(), bt, client.RawPatch("application/merge-patch+json", []byte(`{"metadata":{"finalizers":null}}`)))
			_ = k8s.Delete(ctxBackground(), bt)
		}
	})
	var table []string
	names := slices.Sorted(func(yield func(string) bool) {
		for n := range phases {
			if !yield(n) {
				return
			}
		}
	})
	for _, name := range names {
		p := phases[name]
		t.Run(name, func(t *testing.T) {
			NewWithT(t).Eventually(func(g Gomega) {
				got := get(g, p.task)
				g.Expect(p.ready(got)).To(BeTrue(), "status: %s", dump.OneLine(got.Status))
			}).WithTimeout(waitLong).WithPolling(50 * time.Millisecond).Should(Succeed())
			if p.after != nil {
				p.after(t, p.task)
			}
			u := readBack(t, p.task)
			got := viewOf(t, u, script)
			if diff := cmp.Diff(p.want, got); diff != "" {
				t.Errorf("view (-want +got):\n%s\nstatus: %v", diff, u.Object["status"])
			}
			checkKStatusInvariants(t, u)
			table = append(table, fmt.Sprintf("| %s | %s | %s | %s |", name, got.Conditions, got.KStatus, got.Health))
		})
	}

	// Two states a running controller passes through too quickly to catch:
	// a task before its first status write, and a spec change not yet
	// observed. Both are real objects with that part of their state undone.
	t.Run("no status yet", func(t *testing.T) {
		u := readBack(t, phases["pending (no agent)"].task)
		unstructured.RemoveNestedField(u.Object, "status")
		got := viewOf(t, u, script)
		// kstatus calls an object with no conditions and no
		// observedGeneration Current; docs/gitops.md gives Flux users the
		// healthCheckExprs that close that gap.
		want := phaseView{"", status.CurrentStatus, "Progressing"}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("view (-want +got):\n%s", diff)
		}
		table = append(table, fmt.Sprintf("| %s | %s | %s | %s |", "created, no status yet (status removed)", "(none)", got.KStatus, got.Health))
	})
	t.Run("spec change not yet observed", func(t *testing.T) {
		u := readBack(t, phases["succeeded"].task)
		u.SetGeneration(u.GetGeneration() + 1)
		got := viewOf(t, u, script)
		want := phaseView{"Ready=True/Succeeded", status.InProgressStatus, "Progressing"}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("view (-want +got):\n%s", diff)
		}
		table = append(table, fmt.Sprintf("| %s | %s | %s | %s |", "succeeded, generation ahead of observedGeneration", got.Conditions, got.KStatus, got.Health))
	})
	t.Logf("phase | conditions | kstatus | Argo CD health\n%s", strings.Join(table, "\n"))
}

// readBack reads a task from the API server as unstructured, as kstatus
// and Argo CD do.
func readBack(t *testing.T, bt *v1.BashTask) *unstructured.Unstructured {
	t.Helper()
	u := &unstructured.Unstructured{}
	u.SetGroupVersionKind(v1.GroupVersion.WithKind("BashTask"))
	if err := k8s.Get(t.Context(), client.ObjectKeyFromObject(bt), u); err != nil {
		t.Fatal(err)
	}
	return u
}

// viewOf computes what GitOps tools see of u.
func viewOf(t *testing.T, u *unstructured.Unstructured, script string) phaseView {
	t.Helper()
	res, err := status.Compute(u)
	if err != nil {
		t.Fatalf("kstatus: %v", err)
	}
	health, message, err := argoHealth(script, u)
	if err != nil {
		t.Fatalf("health.lua: %v", err)
	}
	if message == "" {
		t.Errorf("health %s without a message", health)
	}
	var conds []string
	objConds, _, _ := unstructured.NestedSlice(u.Object, "status", "conditions")
	for _, c := range objConds {
		m := c.(map[string]any)
		switch m["type"] {
		case v1.ConditionReady, v1.ConditionReconciling, v1.ConditionStalled:
			conds = append(conds, fmt.Sprintf("%s=%s/%s", m["type"], m["status"], m["reason"]))
		}
	}
	slices.Sort(conds)
	return phaseView{Conditions: strings.Join(conds, " "), KStatus: res.Status, Health: health}
}

// checkKStatusInvariants checks what every status write must hold: the
// status and each condition stamped with the generation, and never
// Reconciling and Stalled at once.
func checkKStatusInvariants(t *testing.T, u *unstructured.Unstructured) {
	t.Helper()
	bt := &v1.BashTask{}
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, bt); err != nil {
		t.Fatal(err)
	}
	if ptr.Deref(bt.Status.ObservedGeneration, 0) != bt.Generation {
		t.Errorf("status.observedGeneration %v, generation %d", bt.Status.ObservedGeneration, bt.Generation)
	}
	for _, c := range bt.Status.Conditions {
		if c.ObservedGeneration != bt.Generation {
			t.Errorf("condition %s observedGeneration %d, generation %d", c.Type, c.ObservedGeneration, bt.Generation)
		}
	}
	if meta.IsStatusConditionTrue(bt.Status.Conditions, v1.ConditionReconciling) && meta.IsStatusConditionTrue(bt.Status.Conditions, v1.ConditionStalled) {
		t.Errorf("Reconciling and Stalled both True: %+v", bt.Status.Conditions)
	}
}

// readHealthScript returns docs/gitops/argocd/health.lua.
func readHealthScript() (string, error) {
	root, err := testenv.RepoRoot()
	if err != nil {
		return "", err
	}
	b, err := os.ReadFile(filepath.Join(root, "docs", "gitops", "argocd", "health.lua"))
	return string(b), err
}

// argoHealth runs an Argo CD health script on u the way Argo CD does: a
// fresh gopher-lua state, the object as the global obj, the returned table's
// status and message.
func argoHealth(script string, u *unstructured.Unstructured) (health, message string, err error) {
	l := lua.NewState(lua.Options{SkipOpenLibs: true})
	defer l.Close()
	for _, lib := range []struct {
		name string
		open lua.LGFunction
	}{{lua.LoadLibName, lua.OpenPackage}, {lua.BaseLibName, lua.OpenBase}, {lua.TabLibName, lua.OpenTable}, {lua.StringLibName, lua.OpenString}, {lua.MathLibName, lua.OpenMath}} {
		l.Push(l.NewFunction(lib.open))
		l.Push(lua.LString(lib.name))
		l.Call(1, 0)
	}
	l.SetGlobal("obj", luaValue(l, u.Object))
	if err := l.DoString(script); err != nil {
		return "", "", err
	}
	ret, ok := l.Get(-1).(*lua.LTable)
	if !ok {
		return "", "", fmt.Errorf("the script returned %s, not a table", l.Get(-1).Type())
	}
	return lua.LVAsString(ret.RawGetString("status")), lua.LVAsString(ret.RawGetString("message")), nil
}

// luaValue converts a decoded JSON value as Argo CD's lua package does.
func luaValue(l *lua.LState, v any) lua.LValue {
	switch v := v.(type) {
	case nil:
		return lua.LNil
	case bool:
		return lua.LBool(v)
	case string:
		return lua.LString(v)
	case int64:
		return lua.LNumber(v)
	case float64:
		return lua.LNumber(v)
	case []any:
		tbl := l.CreateTable(len(v), 0)
		for _, item := range v {
			tbl.Append(luaValue(l, item))
		}
		return tbl
	case map[string]any:
		tbl := l.CreateTable(0, len(v))
		for k, item := range v {
			tbl.RawSetString(k, luaValue(l, item))
		}
		return tbl
	}
	panic(fmt.Sprintf("luaValue: unexpected %T", v))
}

// TestTTLKeepsGitOpsManagedTasks checks C38: a finished task that Argo CD
// or Flux manages outlives its TTL, with one event saying why, while the
// same task unmanaged is deleted.
func TestTTLKeepsGitOpsManagedTasks(t *testing.T) {
	t.Parallel()
	ns := newNamespace(t)
	ttl := func(bt *v1.BashTask) { bt.Spec.TTLSecondsAfterFinished = ptr.To[int32](1) }
	managed := map[string]*v1.BashTask{
		"argo-annotation": newTask(ns, "argo-annotation", "true", ttl, func(bt *v1.BashTask) {
			bt.Annotations = map[string]string{controllers.AnnotationArgoCDTrackingID: "app:bashtask.dev/BashTask:" + ns + "/argo-annotation"}
		}),
		"argo-label": newTask(ns, "argo-label", "exit 1", ttl, func(bt *v1.BashTask) {
			bt.Labels = map[string]string{controllers.LabelAppInstance: "app"}
		}),
		"flux": newTask(ns, "flux", "true", ttl, func(bt *v1.BashTask) {
			bt.Labels = map[string]string{controllers.LabelFluxKustomizationName: "tasks"}
		}),
	}
	unmanaged := newTask(ns, "unmanaged", "true", ttl)
	create(t, unmanaged)
	for _, bt := range managed {
		create(t, bt)
	}
	g := NewWithT(t)
	g.Eventually(func() bool {
		return apierrors.IsNotFound(k8s.Get(t.Context(), client.ObjectKeyFromObject(unmanaged), &v1.BashTask{}))
	}).WithTimeout(waitLong).Should(BeTrue(), "the unmanaged task outlived its TTL")
	var finished time.Time
	for _, bt := range managed {
		if c := waitTerminal(t, bt).Status.CompletionTime.Time; c.After(finished) {
			finished = c
		}
	}
	g.Consistently(func(g Gomega) {
		for _, bt := range managed {
			got := get(g, bt)
			g.Expect(got.DeletionTimestamp).To(BeNil(), "%s is being deleted", bt.Name)
		}
	}).WithTimeout(time.Until(finished.Add(10 * time.Second))).WithPolling(250 * time.Millisecond).Should(Succeed())

	var list eventsv1.EventList
	g.Expect(k8s.List(t.Context(), &list, client.InNamespace(ns))).To(Succeed())
	kept := map[string][]string{}
	for _, ev := range list.Items {
		if ev.Reason == controllers.ReasonKeptPastTTL {
			kept[ev.Regarding.Name] = append(kept[ev.Regarding.Name], ev.Note)
		}
	}
	for name := range managed {
		notes := kept[name]
		if len(notes) != 1 {
			t.Errorf("%s: %d %s events, want 1: %q", name, len(notes), controllers.ReasonKeptPastTTL, notes)
			continue
		}
		for _, want := range []string{"TTL of 1s", "managed by", "re-run the command"} {
			if !strings.Contains(notes[0], want) {
				t.Errorf("%s: event %q does not say %q", name, notes[0], want)
			}
		}
		if ev := findSeries(list, name); ev != nil {
			t.Errorf("%s: the event repeated: series %+v", name, ev)
		}
	}
}

// findSeries returns the series of the KeptPastTTL event of a task, which
// is set when the recorder saw the same event more than once.
func findSeries(list eventsv1.EventList, name string) *eventsv1.EventSeries {
	for _, ev := range list.Items {
		if ev.Regarding.Name == name && ev.Reason == controllers.ReasonKeptPastTTL {
			return ev.Series
		}
	}
	return nil
}

// TestShortTaskWritesThree checks that the kstatus conditions ride along
// with the writes a short task needed anyway: its create and two status
// writes (the write-ahead and the terminal status), no more.
func TestShortTaskWritesThree(t *testing.T) {
	t.Parallel()
	ns := newNamespace(t)
	wc, err := client.NewWithWatch(rig.Env.Config, client.Options{Scheme: rig.Env.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	bt := newTask(ns, "short", "true")
	create(t, bt)
	w, err := wc.Watch(t.Context(), &v1.BashTaskList{}, client.InNamespace(ns), &client.ListOptions{Raw: &metav1.ListOptions{ResourceVersion: bt.ResourceVersion}})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	writes, settle := 1, time.After(waitLong)
	var last *v1.BashTask
	for done := false; !done; {
		select {
		case ev := <-w.ResultChan():
			if got, ok := ev.Object.(*v1.BashTask); ok && got.ResourceVersion != bt.ResourceVersion {
				writes++
				last = got
				if got.Status.Reason != nil {
					// Anything after the terminal write would show within
					// a couple of seconds (an observed or upload write).
					settle = time.After(2 * time.Second)
				}
			}
		case <-settle:
			done = true
		}
	}
	if last == nil || ptr.Deref(last.Status.Reason, "") != v1.ReasonSucceeded {
		t.Fatalf("the task did not succeed: %v", last)
	}
	if writes != 3 {
		t.Errorf("%d writes for a short task, want 3 (create, write-ahead, terminal)", writes)
	}
	if !meta.IsStatusConditionTrue(last.Status.Conditions, v1.ConditionReady) {
		t.Errorf("the terminal write lacks Ready=True: %+v", last.Status.Conditions)
	}
}

// TestEnvNamesBashCannotExpand checks what the admission warning says of
// such names: the task runs, and printenv sees them.
func TestEnvNamesBashCannotExpand(t *testing.T) {
	t.Parallel()
	ns := newNamespace(t)
	bt := newTask(ns, "odd-env", `printenv 1BAD; printenv "A B"; echo "[$1BAD]"`, func(bt *v1.BashTask) {
		bt.Spec.Env = []v1.EnvVar{{Name: "1BAD", Value: ptr.To("one")}, {Name: "A B", Value: ptr.To("two")}}
	})
	create(t, bt)
	got := waitTerminal(t, bt)
	if out := ptr.Deref(got.Status.Stdout, v1.StreamStatus{}).Tail; ptr.Deref(out, "") != "one\ntwo\n[BAD]\n" {
		t.Errorf("stdout %q, want printenv to see both and $1BAD to be $1 then BAD", ptr.Deref(out, ""))
	}
}
