package system

import (
	"context"
	"fmt"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	v1 "github.com/bashtask/bashtask-operator/api/v1alpha1"
)

// rawWindow runs n tasks named prefix00000, ... on the raw API control
// plane: per task the create and then each status of templates written
// through the status subresource, each conditional on the version the
// previous write returned and, like the controller's, without
// managedFields, from o.workers workers. It returns n divided by
// the time from the first create call to the last terminal watch event (to
// the last write when the templates end in no terminal status).
func (b *bench) rawWindow(ctx context.Context, o options, prefix string, n int, templates []v1.BashTaskStatus) (float64, error) {
	names := make([]string, n)
	for i := range names {
		names[i] = fmt.Sprintf("%s%05d", prefix, i)
	}
	deadline := time.Now().Add(o.phaseTimeout)
	start := time.Now()
	err := runWorkers(ctx, o.workers, names, func(ctx context.Context, name string) error {
		bt := &v1.BashTask{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace}, Spec: v1.BashTaskSpec{Command: "true"}}
		if err := b.c.Create(ctx, bt); err != nil {
			return fmt.Errorf("creating %s: %w", name, err)
		}
		for _, t := range templates {
			// The controller caches tasks without managedFields and so
			// never sends them back; neither does this client.
			bt.ManagedFields = nil
			bt.Status = stamp(t, bt.Generation)
			if err := b.c.Status().Update(ctx, bt); err != nil {
				return fmt.Errorf("writing the status of %s: %w", name, err)
			}
		}
		return nil
	})
	if err != nil {
		return 0, err
	}
	if len(templates) == 0 || templates[len(templates)-1].Reason == nil {
		// Nothing terminal to watch for: the window ends with the last write.
		return float64(n) / time.Since(start).Seconds(), nil
	}
	if err := b.waitTerminal(ctx, names, deadline, "raw API"); err != nil {
		return 0, err
	}
	return float64(n) / b.lastTerminal(names).Sub(start).Seconds(), nil
}

// statusTemplates returns n statuses to write in order: the write-ahead
// first and the terminal status last, as the controller wrote them for a
// sampled task, or made up alike when no sample was seen.
func statusTemplates(sample []v1.BashTaskStatus, n int) []v1.BashTaskStatus {
	if n <= 0 {
		return nil
	}
	if len(sample) == 0 || sample[len(sample)-1].Reason == nil {
		sample = madeUpStatuses()
	}
	out := make([]v1.BashTaskStatus, n)
	for i := range out {
		switch {
		case i == n-1:
			out[i] = sample[len(sample)-1]
		case len(sample) >= 2:
			out[i] = sample[min(i, len(sample)-2)]
		default:
			out[i] = madeUpStatuses()[0]
		}
	}
	return out
}

// stamp copies a template status with its times set to now.
func stamp(t v1.BashTaskStatus, generation int64) v1.BashTaskStatus {
	s := *t.DeepCopy()
	now := metav1.NewTime(time.Now().Truncate(time.Second))
	s.ObservedGeneration = &generation
	if s.StartTime != nil {
		s.StartTime = &now
	}
	if s.CompletionTime != nil {
		s.CompletionTime = &now
	}
	for i := range s.Conditions {
		s.Conditions[i].LastTransitionTime = now
		s.Conditions[i].ObservedGeneration = generation
	}
	return s
}

// madeUpStatuses are a write-ahead and a terminal status of a `true` task
// shaped like the controller's.
func madeUpStatuses() []v1.BashTaskStatus {
	now := metav1.NewTime(time.Now().Truncate(time.Second))
	zero := int32(0)
	enforced := true
	agent := &v1.AgentRef{Pod: ptr.To("bashtask-agent-node-1"), Incarnation: ptr.To("0f6c2b8e-3a51-4d7e-9a0c-5b1e2d3f4a5b")}
	scheduled := metav1.Condition{Type: v1.ConditionScheduled, Status: metav1.ConditionTrue, Reason: "Dispatched",
		Message: "dispatched to the agent on node node-1", LastTransitionTime: now}
	ahead := v1.BashTaskStatus{Phase: ptr.To(v1.PhasePending), NodeName: ptr.To("node-1"), Agent: agent, Conditions: []metav1.Condition{scheduled}}
	empty := func() *v1.StreamStatus {
		return &v1.StreamStatus{TotalBytes: ptr.To[int64](0), SHA256: ptr.To("e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855")}
	}
	done := v1.BashTaskStatus{
		Phase: ptr.To(v1.PhaseSucceeded), Reason: ptr.To(v1.ReasonSucceeded), Message: ptr.To("the command exited with status 0"),
		ExitCode: &zero, NodeName: ptr.To("node-1"), Agent: agent,
		Isolation: &v1.IsolationStatus{Mechanism: ptr.To(v1.IsolationCgroup), LimitsEnforced: &enforced},
		StartTime: &now, CompletionTime: &now,
		Stdout: empty(), Stderr: empty(),
		LeftoverProcesses: &zero,
		Conditions: []metav1.Condition{scheduled,
			{Type: v1.ConditionRunning, Status: metav1.ConditionFalse, Reason: "Exited", Message: "the command exited", LastTransitionTime: now},
			{Type: v1.ConditionComplete, Status: metav1.ConditionTrue, Reason: "Succeeded", Message: "the command exited with status 0", LastTransitionTime: now}},
	}
	return []v1.BashTaskStatus{ahead, done}
}
