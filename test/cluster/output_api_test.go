//go:build linux

package cluster

// Helpers of TestOutputAPI, which is in cases_test.go so that it runs
// before TestHelmUninstall.

import (
	"bytes"
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"testing"

	authorizationv1 "k8s.io/api/authorization/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// outputAPIService is the chart's APIService (charts/bashtask/templates/output-api.yaml).
const outputAPIService = "v1alpha1.output.bashtask.dev"

// kubectlOut runs the cluster's kubectl with stdout and stderr apart (a
// byte-exact read must not have kubectl's warnings mixed in).
func kubectlOut(ctx context.Context, args ...string) (stdout []byte, stderr string, err error) {
	cmd := exec.CommandContext(ctx, filepath.Join(root, "bin", "k8s", "kubectl"), append([]string{"--kubeconfig", cluster.Kubeconfig()}, args...)...)
	var errBuf bytes.Buffer
	cmd.Stderr = &errBuf
	out, err := cmd.Output()
	return out, errBuf.String(), err
}

// logPath is the log subresource of a task in the output API.
func logPath(ns, name, query string) string {
	p := fmt.Sprintf("/apis/output.bashtask.dev/v1alpha1/namespaces/%s/bashtasks/%s/log", ns, name)
	if query != "" {
		p += "?" + query
	}
	return p
}

// allowed asks the API server whether user (authenticated, with no other
// group) may get the task's log in ns.
func allowed(t *testing.T, user, ns string) bool {
	t.Helper()
	sar := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
		User: user, Groups: []string{"system:authenticated"},
		ResourceAttributes: &authorizationv1.ResourceAttributes{
			Verb: "get", Group: "output.bashtask.dev", Resource: "bashtasks", Subresource: "log", Namespace: ns, Name: "any",
		},
	}}
	got, err := cs.AuthorizationV1().SubjectAccessReviews().Create(t.Context(), sar, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return got.Status.Allowed
}

// bindRole binds the ClusterRole to the user in ns.
func bindRole(t *testing.T, ns, clusterRole, user string) {
	t.Helper()
	b := &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: user},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: clusterRole},
		Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: user}},
	}
	if err := k8s.Create(t.Context(), b); err != nil {
		t.Fatal(err)
	}
}

func keysOf(m map[string]string) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}
