package localcluster

import (
	"context"
	"encoding/base64"
	"fmt"
	"os"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// The output API's objects (docs/output.md).
const (
	// OutputAPIService is the Service the APIService names.
	OutputAPIService = "bashtask-output-api"
	// OutputAPIServerName is the name kube-apiserver checks the output
	// API's serving certificate against (<service>.<namespace>.svc).
	OutputAPIServerName = OutputAPIService + "." + AgentNamespace + ".svc"
	// OutputAPIGroupVersion is the aggregated group and version.
	OutputAPIGroupVersion = "output.bashtask.dev/v1alpha1"
)

// CreateOutputAPIObjects registers the controller's output API with
// kube-apiserver: a headless Service with an EndpointSlice to 127.0.0.1
// on port (faked as the agents' Service is; kube-apiserver routes to the
// endpoint itself with --enable-aggregator-routing) and the APIService
// v1alpha1.output.bashtask.dev, whose caBundle is the local CA that issued
// the server's certificate.
func CreateOutputAPIObjects(ctx context.Context, c client.Client, port int, certs *Certs) error {
	ca, err := os.ReadFile(certs.CAFile)
	if err != nil {
		return err
	}
	apiService := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "apiregistration.k8s.io/v1",
		"kind":       "APIService",
		"metadata":   map[string]any{"name": "v1alpha1.output.bashtask.dev"},
		"spec": map[string]any{
			"group": "output.bashtask.dev", "version": "v1alpha1",
			"service":              map[string]any{"namespace": AgentNamespace, "name": OutputAPIService, "port": int64(443)},
			"groupPriorityMinimum": int64(1000),
			"versionPriority":      int64(15),
		},
	}}
	// caBundle is bytes: base64 in JSON, as unstructured content holds it.
	apiService.Object["spec"].(map[string]any)["caBundle"] = base64.StdEncoding.EncodeToString(ca)
	objs := []client.Object{
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: AgentNamespace}},
		&corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Namespace: AgentNamespace, Name: OutputAPIService},
			Spec: corev1.ServiceSpec{
				ClusterIP: corev1.ClusterIPNone,
				Ports:     []corev1.ServicePort{{Name: "https", Port: 443}},
			},
		},
		&discoveryv1.EndpointSlice{
			ObjectMeta: metav1.ObjectMeta{
				Namespace: AgentNamespace, Name: OutputAPIService + "-local",
				Labels: map[string]string{discoveryv1.LabelServiceName: OutputAPIService},
			},
			AddressType: discoveryv1.AddressTypeFQDN,
			Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{"127.0.0.1"}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)}}},
			Ports:       []discoveryv1.EndpointPort{{Name: ptr.To("https"), Port: ptr.To(int32(port))}},
		},
		apiService,
	}
	for _, o := range objs {
		if err := createIfMissing(ctx, c, o); err != nil {
			return err
		}
	}
	return nil
}

// WaitOutputAPI waits until kube-apiserver serves output.bashtask.dev
// (the APIService is available and discovery lists bashtasks/log).
func WaitOutputAPI(ctx context.Context, cfg *rest.Config, timeout time.Duration) error {
	dc, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		return err
	}
	deadline := time.Now().Add(timeout)
	for {
		list, err := dc.ServerResourcesForGroupVersion(OutputAPIGroupVersion)
		if err == nil {
			for _, r := range list.APIResources {
				if r.Name == "bashtasks/log" {
					return nil
				}
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("kube-apiserver does not serve %s after %s: %w", OutputAPIGroupVersion, timeout, err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}
