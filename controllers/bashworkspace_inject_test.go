package controllers_test

import (
	"encoding/json"
	"strings"
	"testing"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/bashtask/bashtask-operator/api/v1alpha1"
	"github.com/bashtask/bashtask-operator/controllers"
)

// A workspace whose spec.egress.inject names a Secret that does not
// exist, then one without the key, stays Pending with the EgressPolicy
// condition (reason MissingReference) naming the Secret and the key; once
// the key exists the wait is over, and the value is in neither the
// workspace's status nor an event.
func TestWorkspaceInjectionSecretMissing(t *testing.T) {
	ns := newNamespace(t)
	g := NewWithT(t)
	ws := &v1.BashWorkspace{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "inject"}, Spec: v1.BashWorkspaceSpec{
		Network: ptr.To(v1.NetworkEgress),
		Egress: &v1.EgressPolicy{Inject: []v1.EgressInjection{{Domain: "api.example", Header: "Authorization",
			ValuePrefix: ptr.To("Bearer "), SecretKeyRef: v1.KeySelector{Name: "gh", Key: "token"}}}},
	}}
	g.Expect(k8s.Create(t.Context(), ws)).To(Succeed())
	waitMissing := func(want string) {
		t.Helper()
		g.Eventually(func(g Gomega) {
			st := getWorkspace(g, ws).Status
			g.Expect(st.Phase).To(HaveValue(Equal(v1.WorkspacePending)))
			g.Expect(st.Message).To(HaveValue(ContainSubstring(want)))
			c := meta.FindStatusCondition(st.Conditions, v1.ConditionEgressPolicy)
			g.Expect(c).NotTo(BeNil())
			g.Expect(c.Status).To(Equal(metav1.ConditionFalse))
			g.Expect(c.Reason).To(Equal(controllers.ReasonMissingReference))
			g.Expect(c.Message).To(ContainSubstring(want))
			g.Expect(st.NodeName).To(BeNil(), "placed before the Secret existed")
		}).WithTimeout(waitLong).Should(Succeed())
	}
	waitMissing(`spec.egress.inject[0].secretKeyRef: Secret "gh" not found`)

	secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "gh"}, Data: map[string][]byte{"other": []byte("x")}}
	g.Expect(k8s.Create(t.Context(), secret)).To(Succeed())
	waitMissing(`spec.egress.inject[0].secretKeyRef: key "token" not found in Secret "gh"`)

	const value = "s3cret-token-value"
	secret.Data["token"] = []byte(value)
	g.Expect(k8s.Update(t.Context(), secret)).To(Succeed())
	g.Eventually(func(g Gomega) {
		st := getWorkspace(g, ws).Status
		c := meta.FindStatusCondition(st.Conditions, v1.ConditionEgressPolicy)
		g.Expect(c == nil || c.Reason != controllers.ReasonMissingReference).To(BeTrue(), "still waiting: %+v", c)
		g.Expect(st.Message).NotTo(HaveValue(ContainSubstring("secretKeyRef")))
	}).WithTimeout(waitLong).Should(Succeed())
	b, err := json.Marshal(getWorkspace(g, ws).Status)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(string(b)).NotTo(ContainSubstring(value))
	var events eventsv1.EventList
	g.Expect(k8s.List(t.Context(), &events, client.InNamespace(ns))).To(Succeed())
	for _, e := range events.Items {
		if strings.Contains(e.Note, value) {
			t.Errorf("event %s holds the value", e.Name)
		}
	}
}
