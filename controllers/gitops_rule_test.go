package controllers

import (
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/events"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/client"

	bashtaskv1alpha1 "github.com/bashtask/bashtask-operator/api/v1alpha1"
)

func TestKeepManaged(t *testing.T) {
	task := func(labels, annotations map[string]string) *bashtaskv1alpha1.BashTask {
		return &bashtaskv1alpha1.BashTask{ObjectMeta: metav1.ObjectMeta{
			Namespace: "ns", Name: "t", UID: "u1", Labels: labels, Annotations: annotations,
		}}
	}
	tests := map[string]struct {
		bt          *bashtaskv1alpha1.BashTask
		ttlDeletes  bool
		wantManager string
		wantKept    bool
	}{
		"unmanaged":              {bt: task(nil, nil)},
		"argo annotation":        {bt: task(nil, map[string]string{AnnotationArgoCDTrackingID: "app:bashtask.dev/BashTask:ns/t"}), wantManager: "Argo CD (annotation argocd.argoproj.io/tracking-id)", wantKept: true},
		"argo label":             {bt: task(map[string]string{LabelAppInstance: "app"}, nil), wantManager: "Argo CD or Helm (label app.kubernetes.io/instance)", wantKept: true},
		"flux label":             {bt: task(map[string]string{LabelFluxKustomizationName: "tasks"}, nil), wantManager: "Flux (label kustomize.toolkit.fluxcd.io/name)", wantKept: true},
		"flag lets the TTL act":  {bt: task(map[string]string{LabelFluxKustomizationName: "tasks"}, nil), ttlDeletes: true, wantManager: "Flux (label kustomize.toolkit.fluxcd.io/name)"},
		"other labels unmanaged": {bt: task(map[string]string{"app": "x"}, map[string]string{"note": "y"})},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			if got := GitOpsManager(tc.bt); got != tc.wantManager {
				t.Errorf("GitOpsManager = %q, want %q", got, tc.wantManager)
			}
			rec := events.NewFakeRecorder(10)
			opts := DefaultOptions()
			opts.TTLDeletesGitOpsManaged = tc.ttlDeletes
			r := NewBashTaskReconciler(nil, nil, nil, rec, clocktesting.NewFakePassiveClock(metav1.Now().Time), opts, nil)
			for range 3 { // every later pass keeps it without a new event
				if got := r.keepManaged(tc.bt, 5); got != tc.wantKept {
					t.Fatalf("keepManaged = %v, want %v", got, tc.wantKept)
				}
			}
			wantEvents := 0
			if tc.wantKept {
				wantEvents = 1
			}
			if len(rec.Events) != wantEvents {
				t.Errorf("%d events, want %d", len(rec.Events), wantEvents)
			}
			// A new task under the same name gets its own event.
			r.forgetKept(client.ObjectKeyFromObject(tc.bt))
			if tc.wantKept && r.keepManaged(tc.bt, 5) && len(rec.Events) != 2 {
				t.Errorf("after forgetKept: %d events, want 2", len(rec.Events))
			}
		})
	}
}
