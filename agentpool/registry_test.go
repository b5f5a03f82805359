package agentpool

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/utils/ptr"
)

// One endpoint per node: a ready one, else a terminating one (a draining
// agent's pod, never ready by the EndpointSlice API's rule), never one
// that is only not ready.
func TestEndpointAddresses(t *testing.T) {
	ep := func(node, ip string, ready, terminating *bool) discoveryv1.Endpoint {
		return discoveryv1.Endpoint{
			Addresses: []string{ip}, NodeName: ptr.To(node),
			Conditions: discoveryv1.EndpointConditions{Ready: ready, Terminating: terminating},
		}
	}
	yes, no := ptr.To(true), ptr.To(false)
	tests := map[string]struct {
		endpoints []discoveryv1.Endpoint
		want      map[string]string
	}{
		"ready":                   {[]discoveryv1.Endpoint{ep("n1", "10.0.0.1", yes, nil)}, map[string]string{"n1": "10.0.0.1:9443"}},
		"readiness unknown":       {[]discoveryv1.Endpoint{ep("n1", "10.0.0.1", nil, nil)}, map[string]string{"n1": "10.0.0.1:9443"}},
		"not ready yet":           {[]discoveryv1.Endpoint{ep("n1", "10.0.0.1", no, nil)}, map[string]string{}},
		"not ready, terminating":  {[]discoveryv1.Endpoint{ep("n1", "10.0.0.1", no, yes)}, map[string]string{"n1": "10.0.0.1:9443"}},
		"not ready, not stopping": {[]discoveryv1.Endpoint{ep("n1", "10.0.0.1", no, no)}, map[string]string{}},
		"a ready pod wins over a terminating one, in either order": {
			[]discoveryv1.Endpoint{ep("n1", "10.0.0.1", no, yes), ep("n1", "10.0.0.2", yes, nil), ep("n2", "10.0.0.4", yes, nil), ep("n2", "10.0.0.3", no, yes)},
			map[string]string{"n1": "10.0.0.2:9443", "n2": "10.0.0.4:9443"},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			slices := []discoveryv1.EndpointSlice{{
				Endpoints: tc.endpoints,
				Ports:     []discoveryv1.EndpointPort{{Name: ptr.To("grpc"), Port: ptr.To[int32](9443)}},
			}}
			if diff := cmp.Diff(tc.want, endpointAddresses(slices, "grpc")); diff != "" {
				t.Errorf("addresses (-want +got):\n%s", diff)
			}
		})
	}
}
