package controllers_test

import (
	"os"
	"path/filepath"
	"testing"

	. "github.com/onsi/gomega"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/bashtask/bashtask-operator/api/v1alpha1"
	"github.com/bashtask/bashtask-operator/controllers"
)

// TestUploadErrorInCondition (C42): while the bucket refuses a task's
// object, OutputUploaded is False/UploadPending and its message carries
// the agent's error; once the bucket takes it, True/Uploaded.
func TestUploadErrorInCondition(t *testing.T) {
	ns := newNamespace(t)
	bt := newTask(ns, "unwritable", "seq -f 'line-%04g' 1 20000", func(bt *v1.BashTask) {
		bt.Spec.NodeName = ptr.To("node-a")
		bt.Spec.Suspend = ptr.To(true) // held until the bucket is broken
	})
	create(t, bt)
	// The agent's file bucket writes <key>.attrs in the writer's Close: a
	// directory there makes every Close of this object fail.
	attrs := filepath.Join(rig.Agents["node-a"].StateDir, "uploads", ns, bt.Name, string(bt.UID), "stdout.attrs")
	g := NewWithT(t)
	g.Expect(os.MkdirAll(attrs, 0o700)).To(Succeed())
	g.Expect(k8s.Patch(t.Context(), bt, client.RawPatch(types.MergePatchType, []byte(`{"spec":{"suspend":false}}`)))).To(Succeed())
	got := waitTerminal(t, bt)
	g.Expect(got.Status.Reason).To(HaveValue(Equal(v1.ReasonSucceeded)))
	g.Eventually(func(g Gomega) {
		c := meta.FindStatusCondition(get(g, bt).Status.Conditions, v1.ConditionOutputUploaded)
		g.Expect(c).NotTo(BeNil())
		g.Expect(c.Status).To(Equal(metav1.ConditionFalse))
		g.Expect(c.Reason).To(Equal(controllers.ReasonUploadPending))
		g.Expect(c.Message).To(ContainSubstring("stdout (attempt 1 failed: uploading " + ns + "/unwritable/" + string(bt.UID) + "/stdout: closing the object writer: "))
		g.Expect(c.Message).To(ContainSubstring("is a directory"))
	}).WithTimeout(waitLong).Should(Succeed())
	g.Expect(os.Remove(attrs)).To(Succeed())
	g.Eventually(func(g Gomega) {
		c := meta.FindStatusCondition(get(g, bt).Status.Conditions, v1.ConditionOutputUploaded)
		g.Expect(c).NotTo(BeNil())
		g.Expect(c.Status).To(Equal(metav1.ConditionTrue))
		g.Expect(c.Reason).To(Equal(controllers.ReasonUploaded))
	}).WithTimeout(waitLong).Should(Succeed())
}
