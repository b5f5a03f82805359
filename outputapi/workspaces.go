package outputapi

import (
	"context"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	genericapirequest "k8s.io/apiserver/pkg/endpoints/request"
	"k8s.io/apiserver/pkg/registry/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	outputv1alpha1 "github.com/bashtask/bashtask-operator/api/output/v1alpha1"
	bashtaskv1alpha1 "github.com/bashtask/bashtask-operator/api/v1alpha1"
)

// bashWorkspaceREST serves GET of output.bashtask.dev bashworkspaces: the
// workspace's identity and node from the controller's cache. It is the
// parent resource of bashworkspaces/portforward, which needs one for
// discovery and routing.
type bashWorkspaceREST struct {
	s *Server
}

var (
	_ rest.Getter               = (*bashWorkspaceREST)(nil)
	_ rest.Scoper               = (*bashWorkspaceREST)(nil)
	_ rest.SingularNameProvider = (*bashWorkspaceREST)(nil)
)

func (b *bashWorkspaceREST) New() runtime.Object     { return &outputv1alpha1.BashWorkspace{} }
func (b *bashWorkspaceREST) Destroy()                {}
func (b *bashWorkspaceREST) NamespaceScoped() bool   { return true }
func (b *bashWorkspaceREST) GetSingularName() string { return "bashworkspace" }

// Get implements rest.Getter; NotFound (of bashtask.dev bashworkspaces)
// for a missing workspace.
func (b *bashWorkspaceREST) Get(ctx context.Context, name string, _ *metav1.GetOptions) (runtime.Object, error) {
	ns, _ := genericapirequest.NamespaceFrom(ctx)
	w, err := b.s.getWorkspace(ctx, ns, name)
	if err != nil {
		return nil, err
	}
	return toWorkspaceView(w), nil
}

// getWorkspace reads a BashWorkspace from the cache, or from
// kube-apiserver when the cache does not have it (yet); the error is an
// API status.
func (s *Server) getWorkspace(ctx context.Context, ns, name string) (*bashtaskv1alpha1.BashWorkspace, error) {
	var w bashtaskv1alpha1.BashWorkspace
	err := s.cfg.Tasks.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &w)
	if apierrors.IsNotFound(err) && s.cfg.LiveTasks != nil {
		err = s.cfg.LiveTasks.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &w)
	}
	if err != nil {
		if apierrors.IsNotFound(err) {
			return nil, apierrors.NewNotFound(bashtaskv1alpha1.GroupVersion.WithResource("bashworkspaces").GroupResource(), name)
		}
		return nil, apierrors.NewInternalError(err)
	}
	return &w, nil
}

func toWorkspaceView(w *bashtaskv1alpha1.BashWorkspace) *outputv1alpha1.BashWorkspace {
	return &outputv1alpha1.BashWorkspace{
		TypeMeta: metav1.TypeMeta{APIVersion: outputv1alpha1.SchemeGroupVersion.String(), Kind: "BashWorkspace"},
		ObjectMeta: metav1.ObjectMeta{
			Name: w.Name, Namespace: w.Namespace, UID: w.UID, ResourceVersion: w.ResourceVersion,
			Generation: w.Generation, CreationTimestamp: w.CreationTimestamp, DeletionTimestamp: w.DeletionTimestamp,
		},
		Status: outputv1alpha1.BashWorkspaceOutputStatus{
			NodeName: ptr.Deref(w.Status.NodeName, ""),
			Phase:    string(ptr.Deref(w.Status.Phase, "")),
			Network:  string(ptr.Deref(w.Status.Network, "")),
		},
	}
}
