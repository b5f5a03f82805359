package api_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/bashtask/bashtask-operator/api/v1alpha1"
)

// workspace builds a minimal valid BashWorkspace and applies the given
// mutations.
func workspace(ns, name string, mutate ...func(*v1.BashWorkspace)) *v1.BashWorkspace {
	ws := &v1.BashWorkspace{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
	for _, m := range mutate {
		m(ws)
	}
	return ws
}

func quantity(s string) *resource.Quantity { q := resource.MustParse(s); return &q }

func TestWorkspaceCreateValidation(t *testing.T) {
	ns := newNamespace(t)
	tests := map[string]struct {
		mutate  func(*v1.BashWorkspace)
		wantErr string // empty: accepted
	}{
		"minimal workspace": {mutate: func(*v1.BashWorkspace) {}},
		"every field set": {mutate: func(ws *v1.BashWorkspace) {
			ws.Spec.Owner = ptr.To("session-1")
			ws.Spec.NodeSelector = map[string]string{"zone": "a"}
			ws.Spec.Storage = quantity("1Gi")
			ws.Spec.Network = ptr.To(v1.NetworkNone)
			ws.Spec.CarryOver = &v1.CarryOver{WorkingDir: ptr.To(false), Environment: ptr.To(true)}
			ws.Spec.IdleTimeoutSeconds = ptr.To[int32](v1.MaxIdleTimeoutSeconds)
			ws.Spec.Image = ptr.To(v1.ImageReference("registry.example:5000/tools/python:3.12@sha256:" + strings.Repeat("a", 64)))
			ws.Spec.ImagePullSecrets = []v1.ImagePullSecret{{Name: "registry-creds"}}
		}},
		"image with white space": {mutate: func(ws *v1.BashWorkspace) { ws.Spec.Image = ptr.To[v1.ImageReference]("debian bookworm") }, wantErr: "spec.image"},
		"image empty":            {mutate: func(ws *v1.BashWorkspace) { ws.Spec.Image = ptr.To[v1.ImageReference]("") }, wantErr: "spec.image"},
		"image too long":         {mutate: func(ws *v1.BashWorkspace) { ws.Spec.Image = ptr.To(v1.ImageReference(strings.Repeat("a", 513))) }, wantErr: "spec.image"},
		"too many pull secrets": {mutate: func(ws *v1.BashWorkspace) {
			for i := range 17 {
				ws.Spec.ImagePullSecrets = append(ws.Spec.ImagePullSecrets, v1.ImagePullSecret{Name: fmt.Sprintf("s%d", i)})
			}
		}, wantErr: "spec.imagePullSecrets"},
		"storage at the minimum": {mutate: func(ws *v1.BashWorkspace) { ws.Spec.Storage = quantity("32Mi") }},
		"storage at the maximum": {mutate: func(ws *v1.BashWorkspace) { ws.Spec.Storage = quantity("16Ti") }},
		"storage too small":      {mutate: func(ws *v1.BashWorkspace) { ws.Spec.Storage = quantity("31Mi") }, wantErr: "spec.storage must be at least 32Mi"},
		"storage too large":      {mutate: func(ws *v1.BashWorkspace) { ws.Spec.Storage = quantity("17Ti") }, wantErr: "spec.storage must be at most 16Ti"},
		"empty owner":            {mutate: func(ws *v1.BashWorkspace) { ws.Spec.Owner = ptr.To("") }, wantErr: "spec.owner"},
		"owner too long":         {mutate: func(ws *v1.BashWorkspace) { ws.Spec.Owner = ptr.To(strings.Repeat("o", 254)) }, wantErr: "spec.owner"},
		"idle timeout zero":      {mutate: func(ws *v1.BashWorkspace) { ws.Spec.IdleTimeoutSeconds = ptr.To[int32](0) }, wantErr: "spec.idleTimeoutSeconds"},
		"idle timeout too long": {
			mutate:  func(ws *v1.BashWorkspace) { ws.Spec.IdleTimeoutSeconds = ptr.To[int32](v1.MaxIdleTimeoutSeconds + 1) },
			wantErr: "spec.idleTimeoutSeconds",
		},
		"unknown network": {mutate: func(ws *v1.BashWorkspace) { ws.Spec.Network = ptr.To(v1.TaskNetwork("Host")) }, wantErr: "spec.network"},
		"too many selector labels": {mutate: func(ws *v1.BashWorkspace) {
			ws.Spec.NodeSelector = map[string]string{}
			for i := range 33 {
				ws.Spec.NodeSelector[fmt.Sprintf("l%d", i)] = "x"
			}
		}, wantErr: "spec.nodeSelector"},
	}
	i := 0
	for name, tc := range tests {
		i++
		t.Run(name, func(t *testing.T) {
			ws := workspace(ns, fmt.Sprintf("c%d", i), tc.mutate)
			err := env.Client.Create(t.Context(), ws)
			if tc.wantErr == "" {
				if err != nil {
					t.Fatalf("valid workspace rejected: %v", err)
				}
				return
			}
			wantInvalid(t, err, tc.wantErr)
		})
	}
}

func TestWorkspaceDefaults(t *testing.T) {
	ns := newNamespace(t)
	ws := workspace(ns, "defaults", func(ws *v1.BashWorkspace) { ws.Spec.CarryOver = &v1.CarryOver{} })
	if err := env.Client.Create(t.Context(), ws); err != nil {
		t.Fatal(err)
	}
	got := &v1.BashWorkspace{}
	if err := env.Client.Get(t.Context(), client.ObjectKeyFromObject(ws), got); err != nil {
		t.Fatal(err)
	}
	want := v1.BashWorkspaceSpec{CarryOver: &v1.CarryOver{WorkingDir: ptr.To(true), Environment: ptr.To(false)}}
	if diff := cmp.Diff(want, got.Spec); diff != "" {
		t.Errorf("spec after defaulting (-want +got):\n%s", diff)
	}
}

func TestWorkspaceUpdateValidation(t *testing.T) {
	ns := newNamespace(t)
	base := func(ws *v1.BashWorkspace) {
		ws.Spec.Owner = ptr.To("alice")
		ws.Spec.NodeName = ptr.To("node-a")
		ws.Spec.Storage = quantity("1Gi")
		ws.Spec.Network = ptr.To(v1.NetworkNone)
	}
	tests := map[string]struct {
		initial func(*v1.BashWorkspace)
		update  func(*v1.BashWorkspace)
		wantErr string
	}{
		"owner changed":        {update: func(ws *v1.BashWorkspace) { ws.Spec.Owner = ptr.To("bob") }, wantErr: "spec.owner of a BashWorkspace is immutable"},
		"owner removed":        {update: func(ws *v1.BashWorkspace) { ws.Spec.Owner = nil }, wantErr: "spec.owner of a BashWorkspace is immutable (it cannot be added or removed)"},
		"nodeName changed":     {update: func(ws *v1.BashWorkspace) { ws.Spec.NodeName = ptr.To("node-b") }, wantErr: "spec.nodeName of a BashWorkspace is immutable"},
		"nodeName removed":     {update: func(ws *v1.BashWorkspace) { ws.Spec.NodeName = nil }, wantErr: "spec.nodeName of a BashWorkspace is immutable (it cannot be added or removed)"},
		"nodeSelector added":   {update: func(ws *v1.BashWorkspace) { ws.Spec.NodeSelector = map[string]string{"zone": "a"} }, wantErr: "spec.nodeSelector of a BashWorkspace is immutable (it cannot be added or removed)"},
		"nodeSelector changed": {initial: func(ws *v1.BashWorkspace) { ws.Spec.NodeSelector = map[string]string{"zone": "a"} }, update: func(ws *v1.BashWorkspace) { ws.Spec.NodeSelector = map[string]string{"zone": "b"} }, wantErr: "spec.nodeSelector of a BashWorkspace is immutable"},
		"storage changed":      {update: func(ws *v1.BashWorkspace) { ws.Spec.Storage = quantity("2Gi") }, wantErr: "spec.storage of a BashWorkspace is immutable"},
		"storage removed":      {update: func(ws *v1.BashWorkspace) { ws.Spec.Storage = nil }, wantErr: "spec.storage of a BashWorkspace is immutable (it cannot be added or removed)"},
		"network changed":      {update: func(ws *v1.BashWorkspace) { ws.Spec.Network = ptr.To(v1.NetworkEgress) }, wantErr: "spec.network of a BashWorkspace is immutable"},
		"network removed":      {update: func(ws *v1.BashWorkspace) { ws.Spec.Network = nil }, wantErr: "spec.network of a BashWorkspace is immutable (it cannot be added or removed)"},
		"image added":          {update: func(ws *v1.BashWorkspace) { ws.Spec.Image = ptr.To[v1.ImageReference]("debian:bookworm") }, wantErr: "spec.image of a BashWorkspace is immutable (it cannot be added or removed)"},
		"image changed":        {initial: func(ws *v1.BashWorkspace) { ws.Spec.Image = ptr.To[v1.ImageReference]("debian:bookworm") }, update: func(ws *v1.BashWorkspace) { ws.Spec.Image = ptr.To[v1.ImageReference]("debian:trixie") }, wantErr: "spec.image of a BashWorkspace is immutable"},
		"rootInside added":     {update: func(ws *v1.BashWorkspace) { ws.Spec.RootInside = ptr.To(true) }, wantErr: "spec.rootInside of a BashWorkspace is immutable (it cannot be added or removed)"},
		"rootInside changed":   {initial: func(ws *v1.BashWorkspace) { ws.Spec.RootInside = ptr.To(true) }, update: func(ws *v1.BashWorkspace) { ws.Spec.RootInside = ptr.To(false) }, wantErr: "spec.rootInside of a BashWorkspace is immutable"},
		"pull secrets changed": {update: func(ws *v1.BashWorkspace) { ws.Spec.ImagePullSecrets = []v1.ImagePullSecret{{Name: "rotated"}} }},
		"carryOver changed":    {update: func(ws *v1.BashWorkspace) { ws.Spec.CarryOver = &v1.CarryOver{Environment: ptr.To(true)} }},
		"idle timeout added":   {update: func(ws *v1.BashWorkspace) { ws.Spec.IdleTimeoutSeconds = ptr.To[int32](60) }},
		"idle timeout removed": {initial: func(ws *v1.BashWorkspace) { ws.Spec.IdleTimeoutSeconds = ptr.To[int32](60) }, update: func(ws *v1.BashWorkspace) { ws.Spec.IdleTimeoutSeconds = nil }},
	}
	i := 0
	for name, tc := range tests {
		i++
		t.Run(name, func(t *testing.T) {
			ws := workspace(ns, fmt.Sprintf("u%d", i), base)
			if tc.initial != nil {
				tc.initial(ws)
			}
			if err := env.Client.Create(t.Context(), ws); err != nil {
				t.Fatalf("creating: %v", err)
			}
			tc.update(ws)
			err := env.Client.Update(t.Context(), ws)
			if tc.wantErr == "" {
				if err != nil {
					t.Fatalf("valid update rejected: %v", err)
				}
				return
			}
			wantInvalid(t, err, tc.wantErr)
		})
	}
}

// The rules of spec.workspace on a BashTask: placement, network and disk
// come from the workspace, a relative workingDir only means something
// inside one, and the field is immutable.
func TestTaskWorkspaceValidation(t *testing.T) {
	ns := newNamespace(t)
	inWorkspace := func(bt *v1.BashTask) { bt.Spec.Workspace = ptr.To("w1") }
	tests := map[string]struct {
		mutate  func(*v1.BashTask)
		wantErr string
	}{
		"workspace":                   {mutate: inWorkspace},
		"workspace with relative dir": {mutate: func(bt *v1.BashTask) { inWorkspace(bt); bt.Spec.WorkingDir = ptr.To("repo/src") }},
		"workspace with absolute dir": {mutate: func(bt *v1.BashTask) { inWorkspace(bt); bt.Spec.WorkingDir = ptr.To("/repo") }},
		"workspace with memory limit": {mutate: func(bt *v1.BashTask) {
			inWorkspace(bt)
			bt.Spec.Resources = &v1.ResourceLimits{Memory: quantity("64Mi")}
		}},
		"relative dir without":       {mutate: func(bt *v1.BashTask) { bt.Spec.WorkingDir = ptr.To("repo") }, wantErr: "workingDir must be an absolute path (start with /); with spec.workspace it may also be relative to the workspace's root"},
		"workspace and nodeName":     {mutate: func(bt *v1.BashTask) { inWorkspace(bt); bt.Spec.NodeName = ptr.To("node-a") }, wantErr: "spec.nodeName and spec.nodeSelector must be unset with spec.workspace"},
		"workspace and nodeSelector": {mutate: func(bt *v1.BashTask) { inWorkspace(bt); bt.Spec.NodeSelector = map[string]string{"zone": "a"} }, wantErr: "spec.nodeName and spec.nodeSelector must be unset with spec.workspace"},
		"workspace and network":      {mutate: func(bt *v1.BashTask) { inWorkspace(bt); bt.Spec.Network = ptr.To(v1.NetworkNone) }, wantErr: "spec.network must be unset with spec.workspace"},
		"workspace and ephemeral disk": {mutate: func(bt *v1.BashTask) {
			inWorkspace(bt)
			bt.Spec.Resources = &v1.ResourceLimits{EphemeralStorage: quantity("1Gi")}
		}, wantErr: "spec.resources.ephemeralStorage must be unset with spec.workspace"},
		"workspace and image": {mutate: func(bt *v1.BashTask) { inWorkspace(bt); bt.Spec.Image = ptr.To[v1.ImageReference]("debian:bookworm") }, wantErr: "spec.image and spec.imagePullSecrets must be unset with spec.workspace: the task runs in the workspace's image"},
		"workspace and pull secrets": {mutate: func(bt *v1.BashTask) {
			inWorkspace(bt)
			bt.Spec.ImagePullSecrets = []v1.ImagePullSecret{{Name: "creds"}}
		}, wantErr: "spec.image and spec.imagePullSecrets must be unset with spec.workspace"},
		"image without workspace": {mutate: func(bt *v1.BashTask) {
			bt.Spec.Image = ptr.To[v1.ImageReference]("debian:bookworm")
			bt.Spec.ImagePullSecrets = []v1.ImagePullSecret{{Name: "creds"}}
		}},
		"workspace name not a DNS name": {mutate: func(bt *v1.BashTask) { bt.Spec.Workspace = ptr.To("Not_A_Name") }, wantErr: "spec.workspace"},
		"workspace name empty":          {mutate: func(bt *v1.BashTask) { bt.Spec.Workspace = ptr.To("") }, wantErr: "spec.workspace"},
	}
	i := 0
	for name, tc := range tests {
		i++
		t.Run(name, func(t *testing.T) {
			bt := task(ns, fmt.Sprintf("t%d", i), tc.mutate)
			err := env.Client.Create(t.Context(), bt)
			if tc.wantErr == "" {
				if err != nil {
					t.Fatalf("valid task rejected: %v", err)
				}
				return
			}
			wantInvalid(t, err, tc.wantErr)
		})
	}

	updates := map[string]struct {
		initial, update func(*v1.BashTask)
		wantErr         string
	}{
		"workspace added":   {update: inWorkspace, wantErr: "spec.workspace is immutable (it cannot be added or removed)"},
		"workspace removed": {initial: inWorkspace, update: func(bt *v1.BashTask) { bt.Spec.Workspace = nil }, wantErr: "spec.workspace is immutable (it cannot be added or removed)"},
		"image added":       {update: func(bt *v1.BashTask) { bt.Spec.Image = ptr.To[v1.ImageReference]("debian:bookworm") }, wantErr: "spec.image is immutable (it cannot be added or removed)"},
		"image changed": {initial: func(bt *v1.BashTask) { bt.Spec.Image = ptr.To[v1.ImageReference]("debian:bookworm") }, update: func(bt *v1.BashTask) {
			bt.Spec.Image = ptr.To[v1.ImageReference]("debian:trixie")
		}, wantErr: "spec.image is immutable"},
		"workspace changed": {initial: inWorkspace, update: func(bt *v1.BashTask) { bt.Spec.Workspace = ptr.To("w2") }, wantErr: "spec.workspace is immutable"},
	}
	for name, tc := range updates {
		i++
		t.Run(name, func(t *testing.T) {
			bt := task(ns, fmt.Sprintf("t%d", i))
			if tc.initial != nil {
				tc.initial(bt)
			}
			if err := env.Client.Create(t.Context(), bt); err != nil {
				t.Fatalf("creating: %v", err)
			}
			tc.update(bt)
			err := env.Client.Update(t.Context(), bt)
			wantInvalid(t, err, tc.wantErr)
			wantHowToRunAgain(t, err)
		})
	}
}

// Workspaces are selectable by owner, and tasks by the workspace they name.
func TestWorkspaceFieldSelectors(t *testing.T) {
	ns := newNamespace(t)
	ctx := t.Context()
	for _, w := range []struct {
		name  string
		owner *string
	}{{"wa", ptr.To("alice")}, {"wb", ptr.To("bob")}, {"wn", nil}} {
		if err := env.Client.Create(ctx, workspace(ns, w.name, func(ws *v1.BashWorkspace) { ws.Spec.Owner = w.owner })); err != nil {
			t.Fatal(err)
		}
	}
	for _, tk := range []struct{ name, ws string }{{"t1", "wa"}, {"t2", "wa"}, {"t3", "wb"}} {
		if err := env.Client.Create(ctx, task(ns, tk.name, func(bt *v1.BashTask) { bt.Spec.Workspace = ptr.To(tk.ws) })); err != nil {
			t.Fatal(err)
		}
	}
	if err := env.Client.Create(ctx, task(ns, "plain")); err != nil {
		t.Fatal(err)
	}

	var wl v1.BashWorkspaceList
	if err := env.Client.List(ctx, &wl, client.InNamespace(ns), client.MatchingFieldsSelector{Selector: fields.OneTermEqualSelector("spec.owner", "alice")}); err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, w := range wl.Items {
		got = append(got, w.Name)
	}
	if diff := cmp.Diff([]string{"wa"}, got); diff != "" {
		t.Errorf("workspaces of owner alice (-want +got):\n%s", diff)
	}

	var tl v1.BashTaskList
	if err := env.Client.List(ctx, &tl, client.InNamespace(ns), client.MatchingFieldsSelector{Selector: fields.OneTermEqualSelector("spec.workspace", "wa")}); err != nil {
		t.Fatal(err)
	}
	got = nil
	for _, bt := range tl.Items {
		got = append(got, bt.Name)
	}
	if diff := cmp.Diff([]string{"t1", "t2"}, got); diff != "" {
		t.Errorf("tasks of workspace wa (-want +got):\n%s", diff)
	}
}

// A workspace's status is written only through its status subresource.
func TestWorkspaceStatusSubresource(t *testing.T) {
	ns := newNamespace(t)
	ctx := t.Context()
	ws := workspace(ns, "status")
	if err := env.Client.Create(ctx, ws); err != nil {
		t.Fatal(err)
	}
	ws.Status.Phase = ptr.To(v1.WorkspaceReady)
	if err := env.Client.Update(ctx, ws); err != nil {
		t.Fatalf("update through the main resource: %v", err)
	}
	got := &v1.BashWorkspace{}
	if err := env.Client.Get(ctx, client.ObjectKeyFromObject(ws), got); err != nil {
		t.Fatal(err)
	}
	if got.Status.Phase != nil {
		t.Fatalf("status written through the main resource: %+v", got.Status)
	}
	got.Status = v1.BashWorkspaceStatus{Phase: ptr.To(v1.WorkspaceReady), NodeName: ptr.To("node-a"), RunAsUser: ptr.To[int64](2000001), UsedBytes: ptr.To[int64](4096)}
	if err := env.Client.Status().Update(ctx, got); err != nil {
		t.Fatalf("update through the status subresource: %v", err)
	}
	bad := got.DeepCopy()
	bad.Status.Phase = ptr.To(v1.WorkspacePhase("Sleeping"))
	wantInvalid(t, env.Client.Status().Update(ctx, bad), "status.phase")
}
