package controllers_test

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	. "github.com/onsi/gomega"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/dump"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	agentv1 "github.com/bashtask/bashtask-operator/api/agent/v1"
	v1 "github.com/bashtask/bashtask-operator/api/v1alpha1"
	"github.com/bashtask/bashtask-operator/controllers"
)

const waitLong = 30 * time.Second

func newNamespace(t *testing.T) string {
	t.Helper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "ctrl-"}}
	if err := k8s.Create(t.Context(), ns); err != nil {
		t.Fatal(err)
	}
	return ns.Name
}

func newTask(ns, name, command string, mutate ...func(*v1.BashTask)) *v1.BashTask {
	bt := &v1.BashTask{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec:       v1.BashTaskSpec{Command: command, TimeoutSeconds: ptr.To[int32](30), KillGracePeriodSeconds: ptr.To[int32](1)},
	}
	for _, m := range mutate {
		m(bt)
	}
	return bt
}

func create(t *testing.T, bt *v1.BashTask) {
	t.Helper()
	if err := k8s.Create(t.Context(), bt); err != nil {
		t.Fatalf("creating %s: %v", bt.Name, err)
	}
}

func get(g Gomega, bt *v1.BashTask) *v1.BashTask {
	out := &v1.BashTask{}
	g.Expect(k8s.Get(ctxBackground(), client.ObjectKeyFromObject(bt), out)).To(Succeed())
	return out
}

// waitTerminal waits for the task's terminal reason and returns the task.
func waitTerminal(t *testing.T, bt *v1.BashTask) *v1.BashTask {
	t.Helper()
	g := NewWithT(t)
	var got *v1.BashTask
	g.Eventually(func(g Gomega) {
		got = get(g, bt)
		g.Expect(got.Status.Reason).To(HaveValue(Not(BeEmpty())), "status: %s", dump.OneLine(got.Status))
	}).WithTimeout(waitLong).WithPolling(50 * time.Millisecond).Should(Succeed())
	return got
}

func TestOutcomes(t *testing.T) {
	ns := newNamespace(t)
	tests := map[string]struct {
		command    string
		mutate     func(*v1.BashTask)
		wantReason v1.Reason
		wantPhase  v1.Phase
		wantExit   *int32
		wantSignal string
		wantStdout string
		wantStderr string
	}{
		"hello": {
			command: "echo hello", wantReason: v1.ReasonSucceeded, wantPhase: v1.PhaseSucceeded, wantExit: ptr.To[int32](0), wantStdout: "hello\n",
		},
		"C06 exit 42": {
			command: "exit 42", wantReason: v1.ReasonNonZeroExit, wantPhase: v1.PhaseFailed, wantExit: ptr.To[int32](42),
		},
		"C04 kill itself": {
			command: "kill -TERM $$", wantReason: v1.ReasonSignaled, wantPhase: v1.PhaseFailed, wantExit: ptr.To[int32](143), wantSignal: "SIGTERM",
		},
		"C01 timeout": {
			command: "echo -n foo; sleep 30; true", mutate: func(bt *v1.BashTask) { bt.Spec.TimeoutSeconds = ptr.To[int32](1) },
			wantReason: v1.ReasonTimedOut, wantPhase: v1.PhaseFailed, wantExit: ptr.To[int32](143), wantSignal: "SIGTERM", wantStdout: "foo",
		},
		"C26 streams apart": {
			command: "echo out; echo err >&2", wantReason: v1.ReasonSucceeded, wantPhase: v1.PhaseSucceeded, wantExit: ptr.To[int32](0), wantStdout: "out\n", wantStderr: "err\n",
		},
		"C27 working dir missing": {
			command: "true", mutate: func(bt *v1.BashTask) { bt.Spec.WorkingDir = ptr.To("/does/not/exist") },
			wantReason: v1.ReasonStartFailed, wantPhase: v1.PhaseFailed,
		},
		"stdin given": {
			command: "wc -c", mutate: func(bt *v1.BashTask) { bt.Spec.Stdin = ptr.To(strings.Repeat("x", 200000)) },
			wantReason: v1.ReasonSucceeded, wantPhase: v1.PhaseSucceeded, wantExit: ptr.To[int32](0), wantStdout: "200000\n",
		},
		"C17 managed env wins": {
			command: `echo "$BASHTASK_NAME $BASHTASK_NAMESPACE"`,
			mutate: func(bt *v1.BashTask) {
				bt.Spec.Env = []v1.EnvVar{{Name: "BASHTASK_NAME", Value: ptr.To("spoof")}}
			},
			wantReason: v1.ReasonSucceeded, wantPhase: v1.PhaseSucceeded, wantExit: ptr.To[int32](0),
		},
	}
	i := 0
	for name, tc := range tests {
		i++
		taskName := fmt.Sprintf("o%d", i)
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			bt := newTask(ns, taskName, tc.command)
			if tc.mutate != nil {
				tc.mutate(bt)
			}
			create(t, bt)
			got := waitTerminal(t, bt)
			st := got.Status
			reason, phase, message := ptr.Deref(st.Reason, ""), ptr.Deref(st.Phase, ""), ptr.Deref(st.Message, "")
			if reason != tc.wantReason || phase != tc.wantPhase {
				t.Fatalf("reason/phase = %s/%s, want %s/%s; message %q", reason, phase, tc.wantReason, tc.wantPhase, message)
			}
			if tc.wantExit == nil && st.ExitCode != nil || tc.wantExit != nil && (st.ExitCode == nil || *st.ExitCode != *tc.wantExit) {
				t.Errorf("exitCode = %v, want %v", ptr.Deref(st.ExitCode, -1000), ptr.Deref(tc.wantExit, -1000))
			}
			if signal := ptr.Deref(st.Signal, ""); signal != tc.wantSignal {
				t.Errorf("signal = %q, want %q", signal, tc.wantSignal)
			}
			if name == "C17 managed env wins" {
				tc.wantStdout = bt.Name + " " + ns + "\n"
			}
			if tc.wantStdout != "" && (st.Stdout == nil || ptr.Deref(st.Stdout.Tail, "") != tc.wantStdout) {
				t.Errorf("stdout = %s, want tail %q", dump.OneLine(st.Stdout), tc.wantStdout)
			}
			if tc.wantStderr != "" && (st.Stderr == nil || ptr.Deref(st.Stderr.Tail, "") != tc.wantStderr) {
				t.Errorf("stderr = %s, want tail %q", dump.OneLine(st.Stderr), tc.wantStderr)
			}
			node := ptr.Deref(st.NodeName, "")
			if node == "" || st.Agent == nil || ptr.Deref(st.Agent.Incarnation, "") == "" {
				t.Errorf("placement not recorded: node %q agent %s", node, dump.OneLine(st.Agent))
			}
			if st.CompletionTime == nil {
				t.Error("completionTime not set")
			}
			want := v1.ConditionFailed
			if tc.wantReason == v1.ReasonSucceeded {
				want = v1.ConditionComplete
			}
			if c := meta.FindStatusCondition(st.Conditions, want); c == nil || c.Status != metav1.ConditionTrue || c.Reason != string(tc.wantReason) {
				t.Errorf("condition %s = %+v, want True/%s", want, c, tc.wantReason)
			}
			if c := meta.FindStatusCondition(st.Conditions, v1.ConditionScheduled); c == nil || c.Status != metav1.ConditionTrue {
				t.Errorf("condition Scheduled = %+v, want True", c)
			}
			if tc.wantReason == v1.ReasonStartFailed && !strings.Contains(message, "/does/not/exist") {
				t.Errorf("StartFailed message %q does not name the directory", message)
			}
			// The agent is told to forget the task once its status is
			// recorded; the object keeps its finalizer until deleted.
			NewWithT(t).Eventually(func() codes.Code {
				_, err := rig.Agents[node].Server.Get(t.Context(), &agentv1.GetRequest{Uid: string(got.UID)})
				return status.Code(err)
			}).WithTimeout(waitLong).Should(Equal(codes.NotFound))
			if !slices.Contains(got.Finalizers, controllers.Finalizer) {
				t.Errorf("finalizers %v, want %s kept until deletion", got.Finalizers, controllers.Finalizer)
			}
		})
	}
}

func TestLargeAndBinaryOutput(t *testing.T) {
	ns := newNamespace(t)
	t.Run("C23 tail truncated, spill uploaded and identical", func(t *testing.T) {
		t.Parallel()
		bt := newTask(ns, "seq", "seq -f 'line-%04g' 1 20000")
		create(t, bt)
		got := waitTerminal(t, bt)
		out := got.Status.Stdout
		if ptr.Deref(got.Status.Reason, "") != v1.ReasonSucceeded || out == nil {
			t.Fatalf("status %s", dump.OneLine(got.Status))
		}
		var full strings.Builder
		for i := 1; i <= 20000; i++ {
			fmt.Fprintf(&full, "line-%04d\n", i)
		}
		sum := sha256.Sum256([]byte(full.String()))
		tail, truncated := ptr.Deref(out.Tail, ""), ptr.Deref(out.Truncated, false)
		if !strings.HasSuffix(tail, "line-20000\n") || strings.Contains(tail, "line-0001\n") || !truncated {
			t.Errorf("tail: truncated=%v, ends with line-20000: %v, has line-0001: %v", truncated, strings.HasSuffix(tail, "line-20000\n"), strings.Contains(tail, "line-0001\n"))
		}
		if total, sha := ptr.Deref(out.TotalBytes, -1), ptr.Deref(out.SHA256, ""); total != int64(full.Len()) || sha != hex.EncodeToString(sum[:]) {
			t.Errorf("totalBytes %d sha256 %s, want %d %x", total, sha, full.Len(), sum)
		}
		NewWithT(t).Eventually(func(g Gomega) {
			st := get(g, bt).Status
			g.Expect(meta.IsStatusConditionTrue(st.Conditions, v1.ConditionOutputUploaded)).To(BeTrue(), "conditions %+v", st.Conditions)
			g.Expect(st.Stdout.Spill).NotTo(BeNil())
			g.Expect(st.Stdout.Spill.Complete).To(HaveValue(BeTrue()))
			g.Expect(st.Stdout.Spill.Bytes).To(HaveValue(Equal(int64(full.Len()))))
			url := ptr.Deref(st.Stdout.Spill.URL, "")
			path, ok := strings.CutPrefix(url, "file://")
			g.Expect(ok).To(BeTrue(), "spill URL %q", url)
			data, err := os.ReadFile(path)
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(sha256.Sum256(data)).To(Equal(sum))
		}).WithTimeout(waitLong).Should(Succeed())
	})
	t.Run("C25 shape: past the spill limit the object is partial and says so", func(t *testing.T) {
		t.Parallel()
		bt := newTask(ns, "spill-limit", "seq 1 100000", func(bt *v1.BashTask) {
			bt.Spec.Output = &v1.OutputSpec{TailBytes: ptr.To[int32](100), SpillLimitBytes: ptr.To[int64](1000)}
		})
		create(t, bt)
		waitTerminal(t, bt)
		NewWithT(t).Eventually(func(g Gomega) {
			st := get(g, bt).Status
			c := meta.FindStatusCondition(st.Conditions, v1.ConditionOutputUploaded)
			g.Expect(c).NotTo(BeNil())
			g.Expect(c.Status).To(Equal(metav1.ConditionTrue))
			g.Expect(c.Message).To(ContainSubstring("stored in part: stdout (the first 1000 of 588895 bytes"))
			g.Expect(st.Stdout.Spill).NotTo(BeNil())
			g.Expect(ptr.Deref(st.Stdout.Spill.Complete, false)).To(BeFalse())
			g.Expect(st.Stdout.Spill.Bytes).To(HaveValue(Equal(int64(1000))))
			g.Expect(st.Stdout.TotalBytes).To(HaveValue(Equal(int64(588895))))
		}).WithTimeout(waitLong).Should(Succeed())
	})
	t.Run("C22 exact tail is not truncated", func(t *testing.T) {
		t.Parallel()
		bt := newTask(ns, "exact", `head -c 64000 /dev/zero | tr '\0' a`)
		create(t, bt)
		got := waitTerminal(t, bt)
		out := got.Status.Stdout
		if out == nil || ptr.Deref(out.Truncated, false) || len(ptr.Deref(out.Tail, "")) != 64000 || out.Spill != nil {
			t.Fatalf("stdout: %s", dump.OneLine(out))
		}
		if c := meta.FindStatusCondition(got.Status.Conditions, v1.ConditionOutputUploaded); c == nil || c.Reason != controllers.ReasonNotNeeded {
			t.Errorf("OutputUploaded = %+v, want NotNeeded", c)
		}
	})
	t.Run("C24 binary output fits the status budget", func(t *testing.T) {
		t.Parallel()
		bt := newTask(ns, "binary", "head -c 300000 /dev/urandom", func(bt *v1.BashTask) {
			bt.Spec.Output = &v1.OutputSpec{TailBytes: ptr.To[int32](v1.MaxTailBytes)}
		})
		create(t, bt)
		got := waitTerminal(t, bt)
		out := got.Status.Stdout
		if ptr.Deref(got.Status.Reason, "") != v1.ReasonSucceeded || out == nil {
			t.Fatalf("status %s", dump.OneLine(got.Status))
		}
		sanitized, truncated, tail, total := ptr.Deref(out.Sanitized, false), ptr.Deref(out.Truncated, false), ptr.Deref(out.Tail, ""), ptr.Deref(out.TotalBytes, -1)
		if !sanitized || !truncated || !utf8.ValidString(tail) || total != 300000 {
			t.Errorf("stdout sanitized=%v truncated=%v valid=%v total=%d", sanitized, truncated, utf8.ValidString(tail), total)
		}
	})
}

func TestMissingReferenceWaitsThenRuns(t *testing.T) { // C21
	ns := newNamespace(t)
	bt := newTask(ns, "from-secret", `echo "$GREETING"`, func(bt *v1.BashTask) {
		bt.Spec.Env = []v1.EnvVar{{Name: "GREETING", ValueFrom: &v1.ValueSource{SecretKeyRef: &v1.KeySelector{Name: "greeting", Key: "text"}}}}
	})
	create(t, bt)
	g := NewWithT(t)
	g.Eventually(func(g Gomega) {
		st := get(g, bt).Status
		c := meta.FindStatusCondition(st.Conditions, v1.ConditionScheduled)
		g.Expect(c).NotTo(BeNil())
		g.Expect(c.Reason).To(Equal(controllers.ReasonMissingReference))
		g.Expect(c.Message).To(ContainSubstring(`"greeting"`))
	}).WithTimeout(waitLong).Should(Succeed())

	// The Secret exists but lacks the key: the condition names the key.
	secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "greeting"}, Data: map[string][]byte{"other": []byte("x")}}
	g.Expect(k8s.Create(t.Context(), secret)).To(Succeed())
	g.Eventually(func(g Gomega) {
		c := meta.FindStatusCondition(get(g, bt).Status.Conditions, v1.ConditionScheduled)
		g.Expect(c.Message).To(ContainSubstring(`key "text"`))
	}).WithTimeout(waitLong).Should(Succeed())
	g.Consistently(func(g Gomega) {
		g.Expect(get(g, bt).Status.NodeName).To(BeNil(), "dispatched before the value existed")
	}).WithTimeout(time.Second).Should(Succeed())

	secret.Data["text"] = []byte("hello from a secret")
	g.Expect(k8s.Update(t.Context(), secret)).To(Succeed())
	got := waitTerminal(t, bt)
	g.Expect(got.Status.Reason).To(HaveValue(Equal(v1.ReasonSucceeded)))
	g.Expect(got.Status.Stdout.Tail).To(HaveValue(Equal("hello from a secret\n")))
}

func TestCancel(t *testing.T) {
	ns := newNamespace(t)
	g := NewWithT(t)
	t.Run("C03 running task ignoring TERM", func(t *testing.T) {
		bt := newTask(ns, "cancel-running", "trap '' TERM; echo armed; sleep 60")
		create(t, bt)
		g.Eventually(func(g Gomega) {
			st := get(g, bt).Status
			g.Expect(st.Phase).To(HaveValue(Equal(v1.PhaseRunning)))
			g.Expect(st.Stdout).NotTo(BeNil())
			g.Expect(st.Stdout.Tail).To(HaveValue(Equal("armed\n")))
		}).WithTimeout(waitLong).Should(Succeed())
		cancelTask(t, bt)
		got := waitTerminal(t, bt)
		g.Expect(got.Status.Reason).To(HaveValue(Equal(v1.ReasonCancelled)))
		g.Expect(got.Status.Signal).To(HaveValue(Equal("SIGKILL")))
		g.Expect(*got.Status.ExitCode).To(Equal(int32(137)))
	})
	t.Run("C10 finished task is unchanged", func(t *testing.T) {
		bt := newTask(ns, "cancel-finished", "echo done")
		create(t, bt)
		before := waitTerminal(t, bt)
		cancelTask(t, bt)
		// The outcome is unchanged; only observedGeneration follows the
		// spec change, as Kubernetes tooling expects.
		outcome := func(st v1.BashTaskStatus) v1.BashTaskStatus {
			st.ObservedGeneration = nil
			st.Conditions = nil
			return st
		}
		g.Eventually(func(g Gomega) {
			after := get(g, bt)
			g.Expect(after.Status.ObservedGeneration).To(HaveValue(Equal(after.Generation)))
		}).WithTimeout(waitLong).Should(Succeed())
		g.Consistently(func(g Gomega) {
			after := get(g, bt)
			g.Expect(outcome(after.Status)).To(Equal(outcome(before.Status)))
			for _, c := range after.Status.Conditions {
				b := meta.FindStatusCondition(before.Status.Conditions, c.Type)
				g.Expect(b).NotTo(BeNil())
				g.Expect([]string{string(c.Status), c.Reason, c.Message}).To(Equal([]string{string(b.Status), b.Reason, b.Message}))
			}
		}).WithTimeout(2 * time.Second).Should(Succeed())
	})
	t.Run("before dispatch", func(t *testing.T) {
		bt := newTask(ns, "cancel-suspended", "echo never", func(bt *v1.BashTask) { bt.Spec.Suspend = ptr.To(true) })
		create(t, bt)
		g.Eventually(func(g Gomega) {
			c := meta.FindStatusCondition(get(g, bt).Status.Conditions, v1.ConditionScheduled)
			g.Expect(c).NotTo(BeNil())
			g.Expect(c.Reason).To(Equal(controllers.ReasonSuspended))
		}).WithTimeout(waitLong).Should(Succeed())
		cancelTask(t, bt)
		got := waitTerminal(t, bt)
		g.Expect(got.Status.Reason).To(HaveValue(Equal(v1.ReasonCancelled)))
		g.Expect(got.Status.NodeName).To(BeNil())
	})
}

func cancelTask(t *testing.T, bt *v1.BashTask) {
	t.Helper()
	patch := client.RawPatch("application/merge-patch+json", []byte(`{"spec":{"cancelRequested":true}}`))
	if err := k8s.Patch(t.Context(), &v1.BashTask{ObjectMeta: metav1.ObjectMeta{Namespace: bt.Namespace, Name: bt.Name}}, patch); err != nil {
		t.Fatalf("requesting cancel: %v", err)
	}
}

func TestDeleteRunningTaskStopsIt(t *testing.T) {
	ns := newNamespace(t)
	g := NewWithT(t)
	bt := newTask(ns, "delete-running", "echo pid=$$; sleep 60")
	create(t, bt)
	g.Eventually(func(g Gomega) {
		got := get(g, bt)
		g.Expect(got.Status.Phase).To(HaveValue(Equal(v1.PhaseRunning)))
		g.Expect(got.Finalizers).To(ContainElement(controllers.Finalizer))
		g.Expect(got.Status.Stdout).NotTo(BeNil())
		g.Expect(got.Status.Stdout.Tail).To(HaveValue(HavePrefix("pid=")))
	}).WithTimeout(waitLong).Should(Succeed())
	pid := strings.TrimSpace(strings.TrimPrefix(ptr.Deref(get(g, bt).Status.Stdout.Tail, ""), "pid="))
	g.Expect(k8s.Delete(t.Context(), bt)).To(Succeed())
	g.Eventually(func() bool {
		return apierrors.IsNotFound(k8s.Get(t.Context(), client.ObjectKeyFromObject(bt), &v1.BashTask{}))
	}).WithTimeout(waitLong).Should(BeTrue())
	// The shell is gone too, not just the object.
	g.Eventually(func() bool {
		_, err := os.Stat("/proc/" + pid)
		return os.IsNotExist(err)
	}).WithTimeout(5 * time.Second).Should(BeTrue())
}

func TestTTLAfterFinished(t *testing.T) { // C32
	ns := newNamespace(t)
	bt := newTask(ns, "ttl", "true", func(bt *v1.BashTask) { bt.Spec.TTLSecondsAfterFinished = ptr.To[int32](2) })
	create(t, bt)
	got := waitTerminal(t, bt)
	finished := got.Status.CompletionTime.Time
	g := NewWithT(t)
	g.Eventually(func() bool {
		return apierrors.IsNotFound(k8s.Get(t.Context(), client.ObjectKeyFromObject(bt), &v1.BashTask{}))
	}).WithTimeout(waitLong).WithPolling(100 * time.Millisecond).Should(BeTrue())
	if gone := time.Since(finished); gone < 2*time.Second-time.Second {
		t.Errorf("deleted %s after finishing, before its TTL of 2s", gone)
	}
}

func TestPlacement(t *testing.T) {
	ns := newNamespace(t)
	tests := map[string]struct {
		mutate   func(*v1.BashTask)
		wantNode string
	}{
		"nodeName":     {func(bt *v1.BashTask) { bt.Spec.NodeName = ptr.To("node-b") }, "node-b"},
		"nodeSelector": {func(bt *v1.BashTask) { bt.Spec.NodeSelector = map[string]string{"zone": "a"} }, "node-a"},
	}
	i := 0
	for name, tc := range tests {
		i++
		taskName := fmt.Sprintf("p%d", i)
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			bt := newTask(ns, taskName, `echo "$BASHTASK_NODE"`, tc.mutate)
			create(t, bt)
			got := waitTerminal(t, bt)
			node := ptr.Deref(got.Status.NodeName, "")
			if node != tc.wantNode || got.Status.Stdout == nil || ptr.Deref(got.Status.Stdout.Tail, "") != tc.wantNode+"\n" {
				t.Errorf("ran on %q printing %s, want %q", node, dump.OneLine(got.Status.Stdout), tc.wantNode)
			}
		})
	}
	t.Run("no matching node waits", func(t *testing.T) {
		bt := newTask(ns, "nowhere", "true", func(bt *v1.BashTask) { bt.Spec.NodeSelector = map[string]string{"zone": "mars"} })
		create(t, bt)
		NewWithT(t).Eventually(func(g Gomega) {
			c := meta.FindStatusCondition(get(g, bt).Status.Conditions, v1.ConditionScheduled)
			g.Expect(c).NotTo(BeNil())
			g.Expect(c.Reason).To(Equal(controllers.ReasonNoAgent))
			g.Expect(c.Message).To(ContainSubstring("zone=mars"))
		}).WithTimeout(waitLong).Should(Succeed())
	})
}

func TestOwnerLimit(t *testing.T) {
	ns := newNamespace(t)
	g := NewWithT(t)
	first := newTask(ns, "first", "sleep 2", func(bt *v1.BashTask) { bt.Spec.Owner = ptr.To("session-1") })
	create(t, first)
	g.Eventually(func(g Gomega) { g.Expect(get(g, first).Status.NodeName).To(HaveValue(Not(BeEmpty()))) }).WithTimeout(waitLong).Should(Succeed())
	second := newTask(ns, "second", "true", func(bt *v1.BashTask) { bt.Spec.Owner = ptr.To("session-1") })
	other := newTask(ns, "other-owner", "true", func(bt *v1.BashTask) { bt.Spec.Owner = ptr.To("session-2") })
	create(t, second)
	create(t, other)
	g.Eventually(func(g Gomega) {
		c := meta.FindStatusCondition(get(g, second).Status.Conditions, v1.ConditionScheduled)
		g.Expect(c).NotTo(BeNil())
		g.Expect(c.Reason).To(Equal(controllers.ReasonOwnerLimit))
	}).WithTimeout(waitLong).Should(Succeed())
	g.Expect(waitTerminal(t, other).Status.Reason).To(HaveValue(Equal(v1.ReasonSucceeded)), "another owner is not held back")
	a, b := waitTerminal(t, first), waitTerminal(t, second)
	g.Expect(b.Status.Reason).To(HaveValue(Equal(v1.ReasonSucceeded)))
	g.Expect(b.Status.StartTime.Time).NotTo(BeTemporally("<", a.Status.CompletionTime.Time), "second started before first finished")
}

// TestAgentLostKeepsParts: a task whose agent is lost keeps, in its
// status, how many bytes of its stream reached the bucket as parts while
// it ran, and says every byte after them is lost; the parts hold exactly
// the stream's first bytes. Before TestAgentLost, which leaves node-c
// disconnected.
func TestAgentLostKeepsParts(t *testing.T) {
	ns := newNamespace(t)
	const n = 200000 // more than the status tail keeps
	bt := newTask(ns, "lost-parts", fmt.Sprintf("head -c %d /dev/zero | tr '\\0' x; sleep 600", n), func(bt *v1.BashTask) { bt.Spec.NodeName = ptr.To("node-c") })
	create(t, bt)
	g := NewWithT(t)
	g.Eventually(func(g Gomega) {
		st := get(g, bt).Status
		g.Expect(st.Stdout).NotTo(BeNil())
		g.Expect(st.Stdout.Parts).NotTo(BeNil())
		g.Expect(st.Stdout.Parts.KeptBytes).To(HaveValue(Equal(int64(n))))
		g.Expect(st.Stdout.Parts.LostFromOffset).To(BeNil(), "nothing is lost while the agent is there")
	}).WithTimeout(waitLong).Should(Succeed())
	agentC := rig.Agents["node-c"]
	agentC.Disconnect()
	got := waitTerminal(t, bt)
	g.Expect(got.Status.Reason).To(HaveValue(Equal(v1.ReasonAgentLost)))
	want := &v1.StreamParts{KeptBytes: ptr.To(int64(n)), LostFromOffset: ptr.To(int64(n))}
	g.Expect(got.Status.Stdout.Parts).To(Equal(want))
	g.Expect(got.Status.Stderr.Parts).To(BeNil(), "an empty stream loses nothing")
	g.Expect(got.Status.Message).To(HaveValue(ContainSubstring(fmt.Sprintf("stdout: the first %d bytes kept in object storage, every byte from offset %d on lost", n, n))))
	// The parts in the agent's bucket are the stream's first bytes.
	dir := filepath.Join(rig.Dir, "node-c", "uploads", ns, "lost-parts", string(got.UID), "stdout.parts")
	var data []byte
	entries, err := os.ReadDir(dir)
	g.Expect(err).NotTo(HaveOccurred())
	for _, e := range entries {
		if strings.HasSuffix(e.Name(), ".attrs") {
			continue
		}
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		g.Expect(err).NotTo(HaveOccurred())
		data = append(data, b...)
	}
	g.Expect(string(data)).To(Equal(strings.Repeat("x", n)))
	// The agent comes back and forgets the task; the next test finds it
	// connected.
	g.Expect(agentC.Reconnect()).To(Succeed())
	g.Eventually(func(g Gomega) {
		_, err := agentC.Server.Get(t.Context(), &agentv1.GetRequest{Uid: string(got.UID)})
		g.Expect(status.Code(err)).To(Equal(codes.NotFound), "the agent still holds the task: %v", err)
	}).WithTimeout(waitLong).Should(Succeed())
}

func TestAgentLost(t *testing.T) { // C30, agent gone
	ns := newNamespace(t)
	bt := newTask(ns, "lost", "echo before; sleep 600", func(bt *v1.BashTask) { bt.Spec.NodeName = ptr.To("node-c") })
	create(t, bt)
	g := NewWithT(t)
	g.Eventually(func(g Gomega) {
		st := get(g, bt).Status
		g.Expect(st.Phase).To(HaveValue(Equal(v1.PhaseRunning)))
		g.Expect(st.Stdout).NotTo(BeNil())
		g.Expect(st.Stdout.Tail).To(HaveValue(Equal("before\n")))
	}).WithTimeout(waitLong).Should(Succeed())
	rig.Agents["node-c"].Disconnect() // the agent vanishes from the network
	stoppedAt := time.Now()
	got := waitTerminal(t, bt)
	g.Expect(got.Status.Reason).To(HaveValue(Equal(v1.ReasonAgentLost)))
	g.Expect(got.Status.Stdout.Tail).To(HaveValue(Equal("before\n")), "output captured before the loss is kept")
	g.Expect(time.Since(stoppedAt)).To(BeNumerically(">=", agentLostAfter-500*time.Millisecond))
	// The agent comes back with the command still running: the recorded
	// outcome stands, the command is stopped and the agent forgets it.
	agentC := rig.Agents["node-c"]
	g.Expect(agentC.Reconnect()).To(Succeed())
	g.Eventually(func(g Gomega) {
		_, err := agentC.Server.Get(t.Context(), &agentv1.GetRequest{Uid: string(got.UID)})
		g.Expect(status.Code(err)).To(Equal(codes.NotFound), "the agent still holds the task: %v", err)
	}).WithTimeout(10*time.Second).Should(Succeed(), "stopped at once, not when something else notices")
	g.Expect(get(g, bt).Status.Reason).To(HaveValue(Equal(v1.ReasonAgentLost)))
	agentC.Disconnect()
	// Deleting a task of a lost agent does not wait for the agent.
	g.Expect(k8s.Delete(t.Context(), bt)).To(Succeed())
	g.Eventually(func() bool {
		return apierrors.IsNotFound(k8s.Get(t.Context(), client.ObjectKeyFromObject(bt), &v1.BashTask{}))
	}).WithTimeout(waitLong).Should(BeTrue())
}

// TestEvents checks which endings get an event: every failure, and a
// success only after a Started event; a short success has none.
func TestEvents(t *testing.T) {
	ns := newNamespace(t)
	quick := newTask(ns, "quick", "true")
	fails := newTask(ns, "fails", "exit 3")
	slow := newTask(ns, "slow", "sleep 1.5") // past --running-status-delay
	for _, bt := range []*v1.BashTask{quick, fails, slow} {
		create(t, bt)
	}
	for _, bt := range []*v1.BashTask{quick, fails, slow} {
		waitTerminal(t, bt)
	}
	reasons := func(g Gomega) map[string][]string {
		var list eventsv1.EventList
		g.Expect(k8s.List(ctxBackground(), &list, client.InNamespace(ns))).To(Succeed())
		got := map[string][]string{}
		for _, ev := range list.Items {
			got[ev.Regarding.Name] = append(got[ev.Regarding.Name], ev.Type+" "+ev.Reason)
		}
		for _, r := range got {
			slices.Sort(r)
		}
		return got
	}
	want := map[string][]string{
		"fails": {"Warning NonZeroExit"},
		"slow":  {"Normal Started", "Normal Succeeded"},
	}
	g := NewWithT(t)
	g.Eventually(reasons).WithTimeout(waitLong).WithPolling(100 * time.Millisecond).Should(Equal(want))
	// The recorder sends in order, so the quick task's event, had there
	// been one, would be there by now; it stays absent.
	g.Consistently(reasons).WithTimeout(time.Second).Should(Equal(want))
}
