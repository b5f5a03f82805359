package localcluster

import (
	"context"
	"fmt"
	"net"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// Defaults of a local cluster, matching the controller's flag defaults.
const (
	// AgentNamespace is the namespace of the agents' Service.
	AgentNamespace = "bashtask-system"
	// AgentService is the agents' headless Service.
	AgentService = "bashtask-agent"
	// AgentPortName is the name of the agents' gRPC port.
	AgentPortName = "grpc"
	// AgentServerName is the DNS name in the agents' certificate.
	AgentServerName = AgentService + "." + AgentNamespace + ".svc"
)

// Agent describes one local agent: its node and loopback address.
type Agent struct {
	// Node is the Node object's name, which the agent reports.
	Node string
	// IP is the agent's loopback address, such as 127.0.0.2.
	IP string
	// Labels are put on the Node, for spec.nodeSelector.
	Labels map[string]string
}

// LoopbackAgents returns n agents named node-1 ... node-n on 127.0.0.2 ...,
// each labelled bashtask.dev/local-node=<name>.
func LoopbackAgents(n int) []Agent {
	out := make([]Agent, n)
	for i := range out {
		name := fmt.Sprintf("node-%d", i+1)
		out[i] = Agent{Node: name, IP: fmt.Sprintf("127.0.0.%d", i+2), Labels: map[string]string{"bashtask.dev/local-node": name}}
	}
	return out
}

// FreePort returns a TCP port free on ip now. The agents share one port on
// distinct loopback addresses, as a DaemonSet's pods share a container
// port.
func FreePort(ip string) (int, error) {
	l, err := net.Listen("tcp", net.JoinHostPort(ip, "0"))
	if err != nil {
		return 0, fmt.Errorf("finding a free port on %s: %w", ip, err)
	}
	defer func() { _ = l.Close() }()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// CreateAgentObjects creates the Nodes, the agents' namespace, headless
// Service and one EndpointSlice listing every agent as ready on port.
// Objects that exist already are left as they are.
//
// The API server refuses loopback addresses in an IPv4 EndpointSlice, so
// the slice has addressType FQDN and carries the IP literals; the
// controller dials an endpoint the same way whatever its address type.
func CreateAgentObjects(ctx context.Context, c client.Client, agents []Agent, port int) error {
	var endpoints []discoveryv1.Endpoint
	for _, a := range agents {
		node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: a.Node, Labels: a.Labels}}
		if err := createIfMissing(ctx, c, node); err != nil {
			return err
		}
		endpoints = append(endpoints, discoveryv1.Endpoint{
			Addresses:  []string{a.IP},
			NodeName:   ptr.To(a.Node),
			Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)},
		})
	}
	objs := []client.Object{
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: AgentNamespace}},
		&corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Namespace: AgentNamespace, Name: AgentService},
			Spec: corev1.ServiceSpec{
				ClusterIP: corev1.ClusterIPNone,
				Selector:  map[string]string{"app.kubernetes.io/name": AgentService},
				Ports:     []corev1.ServicePort{{Name: AgentPortName, Port: int32(port)}},
			},
		},
		&discoveryv1.EndpointSlice{
			ObjectMeta: metav1.ObjectMeta{
				Namespace: AgentNamespace, Name: AgentService + "-local",
				Labels: map[string]string{discoveryv1.LabelServiceName: AgentService},
			},
			AddressType: discoveryv1.AddressTypeFQDN,
			Endpoints:   endpoints,
			Ports:       []discoveryv1.EndpointPort{{Name: ptr.To(AgentPortName), Port: ptr.To(int32(port))}},
		},
	}
	for _, o := range objs {
		if err := createIfMissing(ctx, c, o); err != nil {
			return err
		}
	}
	return nil
}

func createIfMissing(ctx context.Context, c client.Client, o client.Object) error {
	if err := c.Create(ctx, o); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("creating %T %s: %w", o, client.ObjectKeyFromObject(o), err)
	}
	return nil
}
