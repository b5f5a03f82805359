package main

import (
	"encoding/json"
	"testing"

	"github.com/google/go-cmp/cmp"

	v1 "github.com/bashtask/bashtask-operator/api/v1alpha1"
)

// The recorder reads etcd's JSON gateway: a PUT carries no type, a create
// has equal create and mod revisions, a DELETE carries the last value in
// prev_kv, and the revision becomes the observation's resourceVersion.
func TestRecorderDecodesGatewayEvents(t *testing.T) {
	stored := func(phase string) string {
		raw, _ := json.Marshal([]byte(`{"apiVersion":"bashtask.dev/v1alpha1","kind":"BashTask","metadata":{"name":"t1","namespace":"chaos","uid":"u1","generation":1},"spec":{"command":"true"},"status":{"phase":"` + phase + `"}}`))
		return string(raw)
	}
	msgs := []string{
		`{"kv":{"key":"a2V5","create_revision":"10","mod_revision":"10","value":` + stored("Pending") + `}}`,
		`{"kv":{"key":"a2V5","create_revision":"10","mod_revision":"12","value":` + stored("Running") + `}}`,
		`{"type":"DELETE","kv":{"key":"a2V5","mod_revision":"15"},"prev_kv":{"key":"a2V5","create_revision":"10","mod_revision":"14","value":` + stored("Succeeded") + `}}`,
	}
	r := &recorder{events: map[string][]Observation{}, byName: map[string]*v1.BashTask{}}
	for _, m := range msgs {
		var ev etcdEvent
		if err := json.Unmarshal([]byte(m), &ev); err != nil {
			t.Fatalf("decoding %s: %v", m, err)
		}
		r.recordEvent(ev)
	}
	type seen struct{ Type, RV, Phase string }
	var got []seen
	for _, o := range r.events["u1"] {
		got = append(got, seen{o.Type, o.ResourceVersion, string(*o.Status.Phase)})
	}
	want := []seen{{"ADDED", "10", "Pending"}, {"MODIFIED", "12", "Running"}, {"DELETED", "15", "Succeeded"}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("observations (-want +got):\n%s", diff)
	}
	if len(r.gaps) != 0 || r.rev != 15 {
		t.Errorf("gaps %v, last revision %d; want none and 15", r.gaps, r.rev)
	}
	if r.task("t1") != nil {
		t.Error("a deleted task is still known by name")
	}
}
