package packaging_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"fmt"
	"reflect"
	"slices"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

const (
	// outputGroup is the aggregated API's group (docs/install.md).
	outputGroup = "output.bashtask.dev"
	// outputAPIService is its APIService's name: <version>.<group>, the
	// name the aggregator requires.
	outputAPIService = "v1alpha1." + outputGroup
	// crdGroupPriority is the groupPriorityMinimum kube-apiserver gives
	// CRD groups; below it, bashtask.dev's bashtasks come first in
	// discovery and plain `bashtasks` keeps meaning the CRD.
	crdGroupPriority = 1000
)

// outputAPIObjects are the rendered objects checkOutputAPI relates.
type outputAPIObjects struct {
	deploy              *appsv1.Deployment
	apiServices         []*unstructured.Unstructured
	services            map[string]*corev1.Service
	secrets             map[string]*unstructured.Unstructured
	certificates        map[string]*unstructured.Unstructured
	clusterRoles        []*rbacv1.ClusterRole
	clusterRoleBindings []*rbacv1.ClusterRoleBinding
	roleBindings        []*rbacv1.RoleBinding
}

func collectOutputAPI(t *testing.T, objs []*unstructured.Unstructured) outputAPIObjects {
	t.Helper()
	o := outputAPIObjects{services: map[string]*corev1.Service{}, secrets: map[string]*unstructured.Unstructured{},
		certificates: map[string]*unstructured.Unstructured{}}
	for _, u := range objs {
		switch u.GetKind() {
		case "Deployment":
			o.deploy = &appsv1.Deployment{}
			fromUnstructured(t, u, o.deploy)
		case "APIService":
			o.apiServices = append(o.apiServices, u)
		case "Service":
			s := &corev1.Service{}
			fromUnstructured(t, u, s)
			o.services[s.Name] = s
		case "Secret":
			o.secrets[u.GetName()] = u
		case "Certificate":
			o.certificates[u.GetName()] = u
		case "ClusterRole":
			r := &rbacv1.ClusterRole{}
			fromUnstructured(t, u, r)
			o.clusterRoles = append(o.clusterRoles, r)
		case "ClusterRoleBinding":
			b := &rbacv1.ClusterRoleBinding{}
			fromUnstructured(t, u, b)
			o.clusterRoleBindings = append(o.clusterRoleBindings, b)
		case "RoleBinding":
			b := &rbacv1.RoleBinding{}
			fromUnstructured(t, u, b)
			o.roleBindings = append(o.roleBindings, b)
		}
	}
	return o
}

// checkOutputAPI checks the aggregated output API's objects against each
// other and against the controller's flags: the APIService points at a
// Service that selects every controller pod on the port the controller
// listens on; the serving certificate the controller mounts is valid for
// the name kube-apiserver dials and is trusted by the APIService's CA
// (caBundle from helm, or cert-manager's CA injector); the controller's
// ServiceAccount has the delegation bindings; readers get bashtasks/log
// through the view role.
func checkOutputAPI(t *testing.T, objs []*unstructured.Unstructured, namespace string) {
	o := collectOutputAPI(t, objs)
	if o.deploy == nil {
		return // samples only
	}
	ctrl := o.deploy.Spec.Template.Spec.Containers[0]
	flags := flagValues(ctrl.Args)
	if len(o.apiServices) == 0 {
		// Disabled (or the kustomize configuration, which does not
		// register the API): the controller must not serve it either.
		if v, ok := flags["output-api-port"]; ok && v != "0" {
			t.Errorf("controller --output-api-port=%s, but no APIService registers the API", v)
		}
		if len(o.roleBindings) > 0 {
			t.Errorf("RoleBindings %v rendered without the output API", o.roleBindings[0].Name)
		}
		return
	}
	if len(o.apiServices) != 1 || o.apiServices[0].GetName() != outputAPIService {
		t.Fatalf("want one APIService %s, have %d (first %s)", outputAPIService, len(o.apiServices), o.apiServices[0].GetName())
	}
	as := o.apiServices[0]
	str := func(fields ...string) string {
		v, _, _ := unstructured.NestedString(as.Object, fields...)
		return v
	}
	num := func(fields ...string) int64 {
		v, _, _ := unstructured.NestedInt64(as.Object, fields...)
		return v
	}
	if g, v := str("spec", "group"), str("spec", "version"); g != outputGroup || v != "v1alpha1" {
		t.Errorf("APIService serves %s/%s, want %s/v1alpha1", g, v, outputGroup)
	}
	if skip, _, _ := unstructured.NestedBool(as.Object, "spec", "insecureSkipTLSVerify"); skip {
		t.Errorf("APIService skips TLS verification")
	}
	if p := num("spec", "groupPriorityMinimum"); p <= 0 || p >= crdGroupPriority {
		t.Errorf("APIService groupPriorityMinimum %d, want 1 to %d (below CRD groups, so bashtasks means the CRD)", p, crdGroupPriority-1)
	}
	if p := num("spec", "versionPriority"); p <= 0 {
		t.Errorf("APIService versionPriority %d, want positive", p)
	}

	// The Service: in the release namespace, a ClusterIP (the aggregator
	// dials it), selecting the controller's pods (all replicas, not only
	// the leader: there is no leader label to select).
	svcName, svcNS, svcPort := str("spec", "service", "name"), str("spec", "service", "namespace"), num("spec", "service", "port")
	if svcNS != namespace {
		t.Errorf("APIService's Service is in namespace %q, want %q", svcNS, namespace)
	}
	svc := o.services[svcName]
	if svc == nil {
		t.Fatalf("APIService names Service %s, which is not rendered; services: %v", svcName, keys(o.services))
	}
	if svc.Spec.ClusterIP == corev1.ClusterIPNone {
		t.Errorf("Service %s is headless; the aggregator dials a ClusterIP", svcName)
	}
	if !selects(svc.Spec.Selector, o.deploy.Spec.Template.Labels) || !equalMaps(svc.Spec.Selector, o.deploy.Spec.Selector.MatchLabels) {
		t.Errorf("Service %s selector %v, want the controller Deployment's selector %v", svcName, svc.Spec.Selector, o.deploy.Spec.Selector.MatchLabels)
	}
	var target *intstr.IntOrString
	for _, p := range svc.Spec.Ports {
		if int64(p.Port) == svcPort {
			target = &p.TargetPort
		}
	}
	if svcPort == 0 {
		svcPort = 443 // the APIService's default port
	}
	if target == nil {
		t.Fatalf("Service %s has no port %d, which the APIService names", svcName, svcPort)
	}
	containerPort := int32(-1)
	for _, p := range ctrl.Ports {
		if (target.Type == intstr.String && p.Name == target.StrVal) || (target.Type == intstr.Int && p.ContainerPort == target.IntVal) {
			containerPort = p.ContainerPort
		}
	}
	if containerPort < 0 {
		t.Fatalf("Service %s targets port %s, which the controller container does not declare", svcName, target.String())
	}
	if want := fmt.Sprint(containerPort); flags["output-api-port"] != want {
		t.Errorf("controller --output-api-port=%q, the Service targets container port %d", flags["output-api-port"], containerPort)
	}
	if v, ok := flags["output-api-bind-address"]; ok && v != "0.0.0.0" && v != "::" {
		t.Errorf("controller --output-api-bind-address=%s: the Service reaches the pod's address, not only %s", v, v)
	}
	checkOutputBucket(t, objs, o, ctrl)

	// The serving certificate the controller reads.
	certDir := flags["output-api-cert-dir"]
	if certDir == "" {
		t.Fatalf("controller has no --output-api-cert-dir")
	}
	secretName := mountedSecret(o.deploy, ctrl, certDir)
	if secretName == "" {
		t.Fatalf("controller --output-api-cert-dir=%s is not a mounted Secret", certDir)
	}
	serverName := svcName + "." + svcNS + ".svc"
	caBundle := str("spec", "caBundle")
	if inject := as.GetAnnotations()["cert-manager.io/inject-ca-from"]; inject != "" {
		if caBundle != "" {
			t.Errorf("APIService has both a caBundle and cert-manager.io/inject-ca-from")
		}
		var cert *unstructured.Unstructured
		for _, c := range o.certificates {
			if c.GetNamespace()+"/"+c.GetName() == inject {
				cert = c
			}
		}
		if cert == nil {
			t.Fatalf("cert-manager.io/inject-ca-from %s names no rendered Certificate (have %v)", inject, keys(o.certificates))
		}
		sn, _, _ := unstructured.NestedString(cert.Object, "spec", "secretName")
		dns, _, _ := unstructured.NestedStringSlice(cert.Object, "spec", "dnsNames")
		usages, _, _ := unstructured.NestedStringSlice(cert.Object, "spec", "usages")
		if sn != secretName {
			t.Errorf("Certificate %s writes Secret %s; the controller mounts %s", cert.GetName(), sn, secretName)
		}
		if !slices.Contains(dns, serverName) || !slices.Contains(usages, "server auth") {
			t.Errorf("Certificate %s: dnsNames %v, usages %v; want %s and server auth", cert.GetName(), dns, usages, serverName)
		}
		return
	}
	secret := o.secrets[secretName]
	if secret == nil {
		t.Fatalf("controller mounts Secret %s, which is neither rendered nor issued by cert-manager", secretName)
	}
	if caBundle == "" {
		t.Fatalf("APIService has neither a caBundle nor cert-manager.io/inject-ca-from")
	}
	data := func(key string) []byte {
		v, _, _ := unstructured.NestedString(secret.Object, "data", key)
		b, err := base64.StdEncoding.DecodeString(v)
		if err != nil || len(b) == 0 {
			t.Fatalf("Secret %s key %s: empty or not base64 (%v)", secretName, key, err)
		}
		return b
	}
	caPEM, err := base64.StdEncoding.DecodeString(caBundle)
	if err != nil {
		t.Fatalf("APIService caBundle: %v", err)
	}
	if string(caPEM) != string(data("ca.crt")) {
		t.Errorf("APIService caBundle is not the ca.crt of Secret %s", secretName)
	}
	// What kube-apiserver does: trust caBundle, dial <service>.<ns>.svc.
	pair, err := tls.X509KeyPair(data("tls.crt"), data("tls.key"))
	if err != nil {
		t.Fatalf("Secret %s: %v", secretName, err)
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(caPEM) {
		t.Fatalf("APIService caBundle holds no PEM certificate")
	}
	serverCfg := &tls.Config{Certificates: []tls.Certificate{pair}, MinVersion: tls.VersionTLS12}
	clientCfg := &tls.Config{RootCAs: roots, ServerName: serverName, MinVersion: tls.VersionTLS12}
	if err := handshake(clientCfg, serverCfg); err != nil {
		t.Errorf("a client trusting the APIService's caBundle cannot reach %s with Secret %s: %v", serverName, secretName, err)
	}
	checkOutputAPIRBAC(t, o, namespace)
}

// checkOutputBucket checks that the controller reads the agents' bucket
// with their credentials: the agents' --output-bucket-url, and the Secret
// the agents take their bucket credentials from in its environment.
func checkOutputBucket(t *testing.T, objs []*unstructured.Unstructured, o outputAPIObjects, ctrl corev1.Container) {
	t.Helper()
	var agent *corev1.Container
	for _, u := range objs {
		if u.GetKind() == "DaemonSet" {
			ds := &appsv1.DaemonSet{}
			fromUnstructured(t, u, ds)
			agent = &ds.Spec.Template.Spec.Containers[0]
		}
	}
	if agent == nil {
		t.Fatal("no agent DaemonSet")
	}
	url := flagValues(agent.Args)["output-bucket-url"]
	if got := flagValues(ctrl.Args)["output-bucket-url"]; got != url {
		t.Errorf("controller --output-bucket-url=%q, the agents' is %q", got, url)
	}
	if url == "" {
		return
	}
	secretRefs := func(c *corev1.Container) []string {
		var names []string
		for _, e := range c.EnvFrom {
			if e.SecretRef != nil {
				names = append(names, e.SecretRef.Name)
			}
		}
		return names
	}
	for _, name := range secretRefs(agent) {
		if !slices.Contains(secretRefs(&ctrl), name) {
			t.Errorf("the agents take bucket credentials from Secret %s, the controller does not", name)
		}
	}
}

// checkOutputAPIRBAC checks the rendered RBAC of the output API: the
// delegation bindings of the controller's ServiceAccount, the readers'
// ClusterRole aggregated into view and the stdin writers' aggregated into
// edit.
func checkOutputAPIRBAC(t *testing.T, o outputAPIObjects, namespace string) {
	t.Helper()
	sa := o.deploy.Spec.Template.Spec.ServiceAccountName
	isController := func(subjects []rbacv1.Subject) bool {
		return slices.ContainsFunc(subjects, func(s rbacv1.Subject) bool {
			return s.Kind == rbacv1.ServiceAccountKind && s.Name == sa && s.Namespace == namespace
		})
	}
	if !slices.ContainsFunc(o.clusterRoleBindings, func(b *rbacv1.ClusterRoleBinding) bool {
		return b.RoleRef.Kind == "ClusterRole" && b.RoleRef.Name == "system:auth-delegator" && isController(b.Subjects)
	}) {
		t.Errorf("no ClusterRoleBinding of system:auth-delegator to ServiceAccount %s/%s", namespace, sa)
	}
	if !slices.ContainsFunc(o.roleBindings, func(b *rbacv1.RoleBinding) bool {
		return b.Namespace == "kube-system" && b.RoleRef.Kind == "Role" && b.RoleRef.Name == "extension-apiserver-authentication-reader" && isController(b.Subjects)
	}) {
		t.Errorf("no RoleBinding in kube-system of extension-apiserver-authentication-reader to ServiceAccount %s/%s", namespace, sa)
	}
	var readers []*rbacv1.ClusterRole
	for _, r := range o.clusterRoles {
		if r.Labels["rbac.authorization.k8s.io/aggregate-to-view"] == "true" {
			readers = append(readers, r)
		}
	}
	if len(readers) != 1 {
		t.Fatalf("want one ClusterRole aggregated to view, have %d", len(readers))
	}
	grantsLog := false
	for _, rule := range readers[0].Rules {
		// view is read-only and must stay so: nothing but reads, nothing
		// outside the output group.
		for _, v := range rule.Verbs {
			if v != "get" && v != "list" && v != "watch" {
				t.Errorf("ClusterRole %s aggregated to view grants %q", readers[0].Name, v)
			}
		}
		if !slices.Equal(rule.APIGroups, []string{outputGroup}) {
			t.Errorf("ClusterRole %s aggregated to view grants groups %v", readers[0].Name, rule.APIGroups)
		}
		if slices.Contains(rule.Resources, "bashtasks/log") && slices.Contains(rule.Verbs, "get") {
			grantsLog = true
		}
	}
	if !grantsLog {
		t.Errorf("ClusterRole %s grants no get on %s bashtasks/log: %+v", readers[0].Name, outputGroup, readers[0].Rules)
	}
	// Writing a streamed stdin, a task's terminal and a workspace's
	// port-forward are in edit, as pods/exec, pods/attach and
	// pods/portforward are: create on bashtasks/stdin, get and create on
	// bashtasks/attach and bashworkspaces/portforward, nothing else.
	var writers []*rbacv1.ClusterRole
	for _, r := range o.clusterRoles {
		if r.Labels["rbac.authorization.k8s.io/aggregate-to-edit"] == "true" {
			writers = append(writers, r)
		}
	}
	if len(writers) != 1 {
		t.Fatalf("want one ClusterRole aggregated to edit, have %d", len(writers))
	}
	want := []rbacv1.PolicyRule{
		{APIGroups: []string{outputGroup}, Resources: []string{"bashtasks/stdin"}, Verbs: []string{"create"}},
		{APIGroups: []string{outputGroup}, Resources: []string{"bashtasks/attach"}, Verbs: []string{"get", "create"}},
		{APIGroups: []string{outputGroup}, Resources: []string{"bashworkspaces/portforward"}, Verbs: []string{"get", "create"}},
	}
	if !reflect.DeepEqual(writers[0].Rules, want) {
		t.Errorf("ClusterRole %s aggregated to edit grants %+v, want %+v", writers[0].Name, writers[0].Rules, want)
	}
}

// mountedSecret returns the Secret mounted at dir in the container, or "".
func mountedSecret(d *appsv1.Deployment, c corev1.Container, dir string) string {
	for _, m := range c.VolumeMounts {
		if m.MountPath != dir {
			continue
		}
		for _, v := range d.Spec.Template.Spec.Volumes {
			if v.Name == m.Name && v.Secret != nil {
				return v.Secret.SecretName
			}
		}
	}
	return ""
}

func equalMaps(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if bv, ok := b[k]; !ok || bv != v {
			return false
		}
	}
	return true
}

// TestOutputAPIRBAC applies the chart's RBAC of the output API to the test
// API server (which authorizes with RBAC) and asks it, through
// SubjectAccessReviews, what the controller's ServiceAccount and a reader
// may do: the controller may review tokens and access and read the front
// proxy's configuration, as delegated authentication and authorization
// need; a user bound to the readers' ClusterRole in a namespace may get
// bashtasks/log there and nothing else. The same reviews before the apply
// are denied, so the grants are the chart's. (The aggregation into view
// is kube-controller-manager's, which this server does not run: the
// cluster suite checks it.)
func TestOutputAPIRBAC(t *testing.T) {
	objs := render(t, renderings()[0])
	o := collectOutputAPI(t, objs)
	if o.deploy == nil {
		t.Fatal("no controller Deployment rendered")
	}
	controllerUser := "system:serviceaccount:" + chartNamespace + ":" + o.deploy.Spec.Template.Spec.ServiceAccountName
	controllerGroups := []string{"system:serviceaccounts", "system:serviceaccounts:" + chartNamespace, "system:authenticated"}
	const reader, stranger = "output-reader", "someone"
	type review struct {
		name   string
		user   string
		groups []string
		attrs  authorizationv1.ResourceAttributes
		want   bool
	}
	reviews := []review{
		{"controller creates TokenReviews", controllerUser, controllerGroups,
			authorizationv1.ResourceAttributes{Verb: "create", Group: "authentication.k8s.io", Resource: "tokenreviews"}, true},
		{"controller creates SubjectAccessReviews", controllerUser, controllerGroups,
			authorizationv1.ResourceAttributes{Verb: "create", Group: "authorization.k8s.io", Resource: "subjectaccessreviews"}, true},
		{"controller reads extension-apiserver-authentication", controllerUser, controllerGroups,
			authorizationv1.ResourceAttributes{Verb: "get", Resource: "configmaps", Namespace: "kube-system", Name: "extension-apiserver-authentication"}, true},
		{"reader gets bashtasks/log in its namespace", reader, nil,
			authorizationv1.ResourceAttributes{Verb: "get", Group: outputGroup, Resource: "bashtasks", Subresource: "log", Namespace: chartNamespace, Name: "x"}, true},
		{"reader gets no bashtasks/log elsewhere", reader, nil,
			authorizationv1.ResourceAttributes{Verb: "get", Group: outputGroup, Resource: "bashtasks", Subresource: "log", Namespace: "bashtask-system", Name: "x"}, false},
		{"reader gets no bashtask.dev bashtasks/log", reader, nil,
			authorizationv1.ResourceAttributes{Verb: "get", Group: "bashtask.dev", Resource: "bashtasks", Subresource: "log", Namespace: chartNamespace, Name: "x"}, false},
		{"stranger gets no bashtasks/log", stranger, []string{"system:authenticated"},
			authorizationv1.ResourceAttributes{Verb: "get", Group: outputGroup, Resource: "bashtasks", Subresource: "log", Namespace: chartNamespace, Name: "x"}, false},
	}
	ask := func(r review) bool {
		attrs := r.attrs
		sar := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
			User: r.user, Groups: r.groups, ResourceAttributes: &attrs,
		}}
		if err := env.Client.Create(t.Context(), sar); err != nil {
			t.Fatalf("%s: %v", r.name, err)
		}
		return sar.Status.Allowed
	}
	for _, r := range reviews {
		if r.want && ask(r) {
			t.Fatalf("%s: allowed before the chart's RBAC was applied; the test proves nothing", r.name)
		}
	}

	// Apply the output API's RBAC for real, with the ServiceAccount, and a
	// RoleBinding of the readers' ClusterRole to the reader.
	var readerRole string
	for _, u := range objs {
		switch {
		case u.GetKind() == "ClusterRole" && u.GetLabels()["rbac.authorization.k8s.io/aggregate-to-view"] == "true":
			readerRole = u.GetName()
		case u.GetKind() == "ClusterRoleBinding" && clusterRoleOf(u) == "system:auth-delegator",
			u.GetKind() == "RoleBinding" && u.GetNamespace() == "kube-system",
			u.GetKind() == "ServiceAccount" && u.GetName() == o.deploy.Spec.Template.Spec.ServiceAccountName:
		default:
			continue
		}
		u := u.DeepCopy()
		if err := env.Client.Apply(t.Context(), client.ApplyConfigurationFromUnstructured(u), client.ForceOwnership, client.FieldOwner("packaging-test")); err != nil {
			t.Fatalf("applying %s %s: %v", u.GetKind(), u.GetName(), err)
		}
		t.Cleanup(func() { _ = env.Client.Delete(context.Background(), u) })
	}
	if readerRole == "" {
		t.Fatal("no ClusterRole aggregated to view rendered")
	}
	binding := &rbacv1.RoleBinding{}
	binding.Namespace, binding.Name = chartNamespace, "output-reader"
	binding.RoleRef = rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: readerRole}
	binding.Subjects = []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: reader}}
	if err := env.Client.Create(t.Context(), binding); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Client.Delete(context.Background(), binding) })

	// The RBAC authorizer reads through an informer: wait until the first
	// grant is visible, then every review must give its answer.
	waitAllowed(t, func() bool { return ask(reviews[0]) })
	waitAllowed(t, func() bool { return ask(reviews[3]) })
	for _, r := range reviews {
		if got := ask(r); got != r.want {
			t.Errorf("%s: allowed %t, want %t", r.name, got, r.want)
		}
	}
}

// waitAllowed waits up to 30 seconds until allowed returns true.
func waitAllowed(t *testing.T, allowed func() bool) {
	t.Helper()
	err := wait.PollUntilContextTimeout(t.Context(), 50*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		return allowed(), nil
	})
	if err != nil {
		t.Fatalf("the chart's grants not in effect after 30 s: %v", err)
	}
}

func clusterRoleOf(u *unstructured.Unstructured) string {
	name, _, _ := unstructured.NestedString(u.Object, "roleRef", "name")
	return name
}
