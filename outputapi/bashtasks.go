package outputapi

import (
	"context"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	genericapirequest "k8s.io/apiserver/pkg/endpoints/request"
	"k8s.io/apiserver/pkg/registry/rest"

	outputv1alpha1 "github.com/bashtask/bashtask-operator/api/output/v1alpha1"
	bashtaskv1alpha1 "github.com/bashtask/bashtask-operator/api/v1alpha1"
)

// bashTaskREST serves GET of output.bashtask.dev bashtasks: the task's
// identity and stream sizes from the controller's cache. It is the parent
// resource of bashtasks/log, which needs one for discovery and routing.
type bashTaskREST struct {
	s *Server
}

var (
	_ rest.Getter               = (*bashTaskREST)(nil)
	_ rest.Scoper               = (*bashTaskREST)(nil)
	_ rest.SingularNameProvider = (*bashTaskREST)(nil)
)

func (b *bashTaskREST) New() runtime.Object     { return &outputv1alpha1.BashTask{} }
func (b *bashTaskREST) Destroy()                {}
func (b *bashTaskREST) NamespaceScoped() bool   { return true }
func (b *bashTaskREST) GetSingularName() string { return "bashtask" }

// Get implements rest.Getter; NotFound (of bashtask.dev bashtasks) for a
// missing task.
func (b *bashTaskREST) Get(ctx context.Context, name string, _ *metav1.GetOptions) (runtime.Object, error) {
	ns, _ := genericapirequest.NamespaceFrom(ctx)
	// A deleted task answers from its record (docs/output.md, "After the
	// task is deleted").
	t, _, err := b.s.lookupTask(ctx, ns, name, "")
	if err != nil {
		return nil, err
	}
	return toOutputView(t), nil
}

func toOutputView(t *bashtaskv1alpha1.BashTask) *outputv1alpha1.BashTask {
	out := &outputv1alpha1.BashTask{
		TypeMeta: metav1.TypeMeta{APIVersion: outputv1alpha1.SchemeGroupVersion.String(), Kind: "BashTask"},
		ObjectMeta: metav1.ObjectMeta{
			Name: t.Name, Namespace: t.Namespace, UID: t.UID, ResourceVersion: t.ResourceVersion,
			Generation: t.Generation, CreationTimestamp: t.CreationTimestamp, DeletionTimestamp: t.DeletionTimestamp,
		},
	}
	if t.Status.NodeName != nil {
		out.Status.NodeName = *t.Status.NodeName
	}
	if s := t.Status.Stdout; s != nil && s.TotalBytes != nil {
		out.Status.StdoutBytes = *s.TotalBytes
	}
	if s := t.Status.Stderr; s != nil && s.TotalBytes != nil {
		out.Status.StderrBytes = *s.TotalBytes
	}
	out.Status.Finished = finished(t)
	return out
}
