package operator_test

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/bashtask/bashtask-operator/operator"
)

// TestStripNode: a cached Node keeps what placement reads (labels,
// unschedulable, taints, conditions) and loses the image list, the
// volumes and managedFields.
func TestStripNode(t *testing.T) {
	n := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: "n1", Labels: map[string]string{"zone": "a"}, ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "kubelet"}}},
		Spec:       corev1.NodeSpec{Unschedulable: true, Taints: []corev1.Taint{{Key: "k", Effect: corev1.TaintEffectNoSchedule}}},
		Status: corev1.NodeStatus{
			Conditions:      []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}},
			Images:          []corev1.ContainerImage{{Names: []string{"registry.example/big:1"}, SizeBytes: 1 << 30}},
			VolumesInUse:    []corev1.UniqueVolumeName{"v"},
			VolumesAttached: []corev1.AttachedVolume{{Name: "v"}},
		},
	}
	out, err := operator.StripNode(n)
	if err != nil {
		t.Fatal(err)
	}
	got := out.(*corev1.Node)
	if got.Status.Images != nil || got.Status.VolumesInUse != nil || got.Status.VolumesAttached != nil || got.ManagedFields != nil {
		t.Errorf("kept what the controller never reads: %+v, managedFields %v", got.Status, got.ManagedFields)
	}
	if got.Labels["zone"] != "a" || !got.Spec.Unschedulable || len(got.Spec.Taints) != 1 || len(got.Status.Conditions) != 1 {
		t.Errorf("lost what placement reads: labels %v, spec %+v, conditions %v", got.Labels, got.Spec, got.Status.Conditions)
	}
	if other, _ := operator.StripNode("x"); other != "x" {
		t.Errorf("another object changed: %v", other)
	}
}
