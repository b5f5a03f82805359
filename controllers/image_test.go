package controllers_test

import (
	"testing"
	"time"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/bashtask/bashtask-operator/api/v1alpha1"
	"github.com/bashtask/bashtask-operator/controllers"
)

// An image reference the CRD's pattern lets through but the reference
// grammar refuses: a repository name must be lower case.
const unparsableImage = "registry.example/Upper/Case:1"

// dockerConfigSecret is a pull secret of the right type.
func dockerConfigSecret(ns, name string) *corev1.Secret {
	return &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Type:       corev1.SecretTypeDockerConfigJson,
		Data:       map[string][]byte{corev1.DockerConfigJsonKey: []byte(`{"auths":{"registry.example":{"auth":"dTpw"}}}`)},
	}
}

func getWorkspace(g Gomega, ws *v1.BashWorkspace) *v1.BashWorkspace {
	out := &v1.BashWorkspace{}
	g.Expect(k8s.Get(ctxBackground(), client.ObjectKeyFromObject(ws), out)).To(Succeed())
	return out
}

func TestImageReferenceUnparsable(t *testing.T) {
	ns := newNamespace(t)
	g := NewWithT(t)
	bt := newTask(ns, "bad-image", "true", func(bt *v1.BashTask) { bt.Spec.Image = ptr.To(v1.ImageReference(unparsableImage)) })
	create(t, bt)
	got := waitTerminal(t, bt)
	g.Expect(got.Status.Reason).To(HaveValue(Equal(v1.ReasonInvalidSpec)))
	g.Expect(got.Status.Message).To(HaveValue(And(ContainSubstring("spec.image"), ContainSubstring(unparsableImage), ContainSubstring("could not parse reference"))))
	g.Expect(got.Status.NodeName).To(BeNil(), "dispatched with an image that does not parse")

	ws := &v1.BashWorkspace{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "bad-image"}, Spec: v1.BashWorkspaceSpec{Image: ptr.To(v1.ImageReference(unparsableImage))}}
	g.Expect(k8s.Create(t.Context(), ws)).To(Succeed())
	g.Eventually(func(g Gomega) {
		st := getWorkspace(g, ws).Status
		g.Expect(st.Phase).To(HaveValue(Equal(v1.WorkspaceFailed)))
		g.Expect(st.Message).To(HaveValue(ContainSubstring("spec.image")))
		c := meta.FindStatusCondition(st.Conditions, v1.ConditionStalled)
		g.Expect(c).NotTo(BeNil())
		g.Expect(c.Reason).To(Equal(v1.WorkspaceReasonInvalidSpec))
		g.Expect(st.NodeName).To(BeNil())
	}).WithTimeout(waitLong).Should(Succeed())
}

func TestImagePullSecretOfWrongType(t *testing.T) {
	ns := newNamespace(t)
	g := NewWithT(t)
	opaque := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "opaque"}, Data: map[string][]byte{"x": []byte("y")}}
	g.Expect(k8s.Create(t.Context(), opaque)).To(Succeed())
	withSecret := func(bt *v1.BashTask) {
		bt.Spec.Image = ptr.To(v1.ImageReference("registry.example/tools/bash:5"))
		bt.Spec.ImagePullSecrets = []v1.ImagePullSecret{{Name: "opaque"}}
	}
	bt := newTask(ns, "opaque-secret", "true", withSecret)
	create(t, bt)
	got := waitTerminal(t, bt)
	g.Expect(got.Status.Reason).To(HaveValue(Equal(v1.ReasonInvalidSpec)))
	g.Expect(got.Status.Message).To(HaveValue(And(ContainSubstring(`spec.imagePullSecrets[0]: Secret "opaque"`), ContainSubstring(`type "Opaque"`), ContainSubstring("kubernetes.io/dockerconfigjson"))))

	ws := &v1.BashWorkspace{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "opaque-secret"}, Spec: v1.BashWorkspaceSpec{
		Image: ptr.To(v1.ImageReference("registry.example/tools/bash:5")), ImagePullSecrets: []v1.ImagePullSecret{{Name: "opaque"}},
	}}
	g.Expect(k8s.Create(t.Context(), ws)).To(Succeed())
	g.Eventually(func(g Gomega) {
		st := getWorkspace(g, ws).Status
		g.Expect(st.Phase).To(HaveValue(Equal(v1.WorkspaceFailed)))
		g.Expect(st.Message).To(HaveValue(ContainSubstring(`Secret "opaque" is of type "Opaque"`)))
	}).WithTimeout(waitLong).Should(Succeed())
}

// A missing pull secret is waited for as a missing env reference is;
// once it exists the wait moves on to the placement: the agents of this
// rig run at the process level, without an image store, so the task then
// waits for an agent with the images capability (NoAgent, naming it).
func TestImagePullSecretMissingWaitsThenDispatches(t *testing.T) {
	ns := newNamespace(t)
	g := NewWithT(t)
	bt := newTask(ns, "missing-secret", "echo ran", func(bt *v1.BashTask) {
		bt.Spec.Image = ptr.To(v1.ImageReference("registry.example/tools/bash:5"))
		bt.Spec.ImagePullSecrets = []v1.ImagePullSecret{{Name: "regcred"}}
	})
	create(t, bt)
	ws := &v1.BashWorkspace{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "missing-secret"}, Spec: v1.BashWorkspaceSpec{
		Image: ptr.To(v1.ImageReference("registry.example/tools/bash:5")), ImagePullSecrets: []v1.ImagePullSecret{{Name: "regcred"}},
	}}
	g.Expect(k8s.Create(t.Context(), ws)).To(Succeed())
	g.Eventually(func(g Gomega) {
		st := get(g, bt).Status
		c := meta.FindStatusCondition(st.Conditions, v1.ConditionScheduled)
		g.Expect(c).NotTo(BeNil())
		g.Expect(c.Reason).To(Equal(controllers.ReasonMissingReference))
		g.Expect(c.Message).To(ContainSubstring(`spec.imagePullSecrets[0]: Secret "regcred" not found`))
		wst := getWorkspace(g, ws).Status
		g.Expect(wst.Phase).To(HaveValue(Equal(v1.WorkspacePending)))
		wc := meta.FindStatusCondition(wst.Conditions, v1.ConditionImagePulled)
		g.Expect(wc).NotTo(BeNil())
		g.Expect(wc.Reason).To(Equal(controllers.ReasonMissingReference))
		g.Expect(wc.Message).To(ContainSubstring(`Secret "regcred" not found`))
	}).WithTimeout(waitLong).Should(Succeed())
	g.Consistently(func(g Gomega) {
		g.Expect(get(g, bt).Status.NodeName).To(BeNil(), "dispatched before the pull secret existed")
		g.Expect(getWorkspace(g, ws).Status.NodeName).To(BeNil(), "placed before the pull secret existed")
	}).WithTimeout(time.Second).Should(Succeed())

	g.Expect(k8s.Create(t.Context(), dockerConfigSecret(ns, "regcred"))).To(Succeed())
	g.Eventually(func(g Gomega) {
		c := meta.FindStatusCondition(get(g, bt).Status.Conditions, v1.ConditionScheduled)
		g.Expect(c).NotTo(BeNil())
		g.Expect(c.Reason).To(Equal(controllers.ReasonNoAgent))
		g.Expect(c.Message).To(ContainSubstring("spec.image needs an agent with an image store (the images capability"))
	}).WithTimeout(waitLong).Should(Succeed())
	g.Eventually(func(g Gomega) {
		wc := meta.FindStatusCondition(getWorkspace(g, ws).Status.Conditions, v1.ConditionImagePulled)
		g.Expect(wc).To(BeNil(), "the wait for the pull secret is over")
	}).WithTimeout(waitLong).Should(Succeed())
}
