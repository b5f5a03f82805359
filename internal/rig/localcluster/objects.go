package localcluster

import (
	"context"
	"fmt"
	"net"
	"slices"

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

// CreateAgentObjects creates the Nodes, marked Ready (see markReady), the
// agents' namespace, headless Service and one EndpointSlice listing every
// agent as ready on port. Objects that exist already are left as they are.
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
		if err := markReady(ctx, c, a.Node); err != nil {
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

// markReady gives the Node a Ready=True condition when it has no
// conditions at all, and removes the node.kubernetes.io/not-ready taint
// the API server's admission (TaintNodesByCondition) puts on every new
// Node. There is no kubelet to report the condition and no node lifecycle
// controller to lift the taint, and the controller places nothing on a
// Node that is not Ready or has an untolerated NoSchedule taint, as the
// scheduler does not; a Node whose conditions a test set is left as it
// is.
func markReady(ctx context.Context, c client.Client, name string) error {
	var n corev1.Node
	if err := c.Get(ctx, client.ObjectKey{Name: name}, &n); err != nil {
		return fmt.Errorf("reading Node %s: %w", name, err)
	}
	if len(n.Status.Conditions) > 0 {
		return nil
	}
	// Updates, not patches: each write is conditional on the version read,
	// so a taint or condition someone wrote meanwhile is not replaced.
	taints := slices.DeleteFunc(slices.Clone(n.Spec.Taints), func(t corev1.Taint) bool { return t.Key == corev1.TaintNodeNotReady })
	if len(taints) != len(n.Spec.Taints) {
		n.Spec.Taints = taints
		if err := c.Update(ctx, &n); err != nil {
			return fmt.Errorf("removing the %s taint from Node %s: %w", corev1.TaintNodeNotReady, name, err)
		}
	}
	now := metav1.Now()
	n.Status.Conditions = []corev1.NodeCondition{{
		Type: corev1.NodeReady, Status: corev1.ConditionTrue,
		Reason: "LocalAgent", Message: "no kubelet: the local cluster marks its Nodes Ready",
		LastHeartbeatTime: now, LastTransitionTime: now,
	}}
	if err := c.Status().Update(ctx, &n); err != nil {
		return fmt.Errorf("marking Node %s Ready: %w", name, err)
	}
	return nil
}

func createIfMissing(ctx context.Context, c client.Client, o client.Object) error {
	if err := c.Create(ctx, o); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("creating %T %s: %w", o, client.ObjectKeyFromObject(o), err)
	}
	return nil
}
