package localcluster

import (
	"context"
	"errors"
	"fmt"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/bashtask/bashtask-operator/api/v1alpha1"
)

// WaitAdmission waits, up to 2 minutes, until the API server applies the
// finalizer policy to new BashTasks of namespace, probing with dry-run
// creates until three in a row come back with the finalizer. The API
// server loads a MutatingAdmissionPolicy some seconds after it is created;
// until then creates pass without the finalizer (costing the controller a
// write), and for a moment after, fail with 503 "Resource kind ... not
// found" while the policy's type converter for the CRD is built. It
// returns ctx's error, or one wrapping the last probe's when the time ran
// out.
func WaitAdmission(ctx context.Context, c client.Client, namespace string) error {
	deadline := time.Now().Add(2 * time.Minute)
	var last error
	for good := 0; good < 3; {
		probe := &v1.BashTask{ObjectMeta: metav1.ObjectMeta{Name: "admission-probe", Namespace: namespace}, Spec: v1.BashTaskSpec{Command: "true"}}
		err := c.Create(ctx, probe, client.DryRunAll)
		switch {
		case err != nil:
			good, last = 0, err
		case len(probe.Finalizers) == 0:
			good, last = 0, errors.New("created without the finalizer")
		default:
			good++
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the finalizer admission policy is not in effect after 2 minutes: %w", last)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
	return nil
}
