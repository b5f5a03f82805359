package outputapi

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strings"

	"gocloud.dev/blob"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/apiserver/pkg/authorization/authorizer"
	openapinamer "k8s.io/apiserver/pkg/endpoints/openapi"
	apirequest "k8s.io/apiserver/pkg/endpoints/request"
	"k8s.io/apiserver/pkg/registry/rest"
	genericapiserver "k8s.io/apiserver/pkg/server"
	genericfilters "k8s.io/apiserver/pkg/server/filters"
	genericoptions "k8s.io/apiserver/pkg/server/options"
	"k8s.io/component-base/compatibility"
	"sigs.k8s.io/controller-runtime/pkg/client"

	agentv1 "github.com/bashtask/bashtask-operator/api/agent/v1"
	outputv1alpha1 "github.com/bashtask/bashtask-operator/api/output/v1alpha1"
	"github.com/bashtask/bashtask-operator/outputapi/openapi"
)

// Agents hands out a client for a node's agent (agentpool.AgentReaders).
type Agents interface {
	// Client returns a client for node's agent, or an error when none is
	// reachable.
	Client(ctx context.Context, node string) (agentv1.ExecutorClient, error)
}

// Config configures the output API server.
type Config struct {
	// BindAddress and Port are where the HTTPS server listens; Port is
	// required (the controller's --output-api-port).
	BindAddress net.IP
	Port        int
	// CertDir holds tls.crt and tls.key, the serving certificate; when
	// they are missing a self-signed pair is generated there (enough
	// behind kube-apiserver's aggregation with insecureSkipTLSVerify, or
	// a caBundle of it).
	CertDir string
	// Kubeconfig reaches kube-apiserver for delegated authentication
	// (TokenReview, the extension-apiserver-authentication ConfigMap) and
	// authorization (SubjectAccessReview); empty means the in-cluster
	// configuration.
	Kubeconfig string
	// Tasks reads BashTasks (the manager's cache).
	Tasks client.Reader
	// LiveTasks, when set, reads a BashTask the cache does not have (yet)
	// from kube-apiserver (the manager's API reader).
	LiveTasks client.Reader
	// Informers, when set, is the cache Tasks reads from (the manager's
	// cache, mgr.GetCache()): a request waiting for its task's dispatch
	// (a follow of a pending task, a write of input before the start) is
	// woken by the cache's BashTask informer as soon as the task has a
	// node. The server adds one event handler to that informer on the
	// first such wait and removes it when Start returns. Nil: the wait
	// reads the task every dispatchPollInterval (100 ms) through Tasks,
	// and LiveTasks when Tasks does not have it.
	Informers Informers
	// Agents reaches the node agents.
	Agents Agents
	// PortForwards reaches the agents' PortForward service for
	// bashworkspaces/portforward (docs/portforward.md); nil refuses
	// every forwarded connection.
	PortForwards PortForwardAgents
	// BucketURL is the gocloud.dev blob URL of the bucket the agents
	// upload to, opened with the controller's own credentials, for the
	// output of tasks whose agent no longer holds it. Empty, or for a
	// spill URL of another bucket, the task's node's agent reads the copy
	// from its own bucket (ReadOutput with object_url).
	BucketURL string
}

// Server is the aggregated API server of output.bashtask.dev.
type Server struct {
	cfg        Config
	generic    *genericapiserver.GenericAPIServer
	bucket     *blob.Bucket
	bucketBase string
	// dispatch wakes the requests waiting for their task's dispatch.
	dispatch dispatchWaits
	// authz is the delegated authorizer, for what the REST machinery does
	// not check: create on bashtasks/attach (attach.go) and the second
	// check of a port-forward GET (authorizeCreate).
	authz authorizer.Authorizer
}

// LongRunning reports whether a request is exempt from the request
// timeout and the max-in-flight limit: every bashtasks/log GET, as
// kube-apiserver treats pods/log (a read of a large finished stream takes
// longer than 60 s too), every bashtasks/stdin POST, which bounds its own
// wait (stdinRequestWait) and must not hold a slot of the max-in-flight
// limit while a command does not read, every bashtasks/attach (a
// terminal's session lasts as long as someone works in it), every
// bashworkspaces/portforward (a connection that lives as long as its
// client), and watches.
func LongRunning(r *http.Request, ri *apirequest.RequestInfo) bool {
	if ri != nil && ri.IsResourceRequest && ri.Resource == "bashtasks" && (ri.Subresource == "log" || ri.Subresource == "stdin" || ri.Subresource == outputv1alpha1.SubresourceAttach) {
		return true
	}
	if ri != nil && ri.IsResourceRequest && ri.Resource == outputv1alpha1.ResourceWorkspaces && ri.Subresource == outputv1alpha1.SubresourcePortForward {
		return true
	}
	return genericfilters.BasicLongRunningRequestCheck(sets.NewString("watch"), sets.NewString())(r, ri)
}

// New builds the server: the recommended options of k8s.io/apiserver
// without etcd, admission or priority and fairness (this server stores
// nothing), with delegated authentication and authorization.
func New(ctx context.Context, cfg Config) (*Server, error) {
	if cfg.Port <= 0 || cfg.Tasks == nil || cfg.Agents == nil {
		return nil, errors.New("output API: a port, a task reader and the agents are required")
	}
	scheme, codecs, err := NewScheme()
	if err != nil {
		return nil, err
	}
	o := genericoptions.NewRecommendedOptions("", codecs.LegacyCodec(outputv1alpha1.SchemeGroupVersion))
	o.Etcd = nil
	o.Admission = nil
	o.CoreAPI = nil
	o.Features.EnablePriorityAndFairness = false
	o.SecureServing.BindPort = cfg.Port
	if cfg.BindAddress != nil {
		o.SecureServing.BindAddress = cfg.BindAddress
	}
	o.SecureServing.ServerCert.CertDirectory = cfg.CertDir
	o.SecureServing.ServerCert.PairName = "tls"
	o.Authentication.RemoteKubeConfigFile = cfg.Kubeconfig
	o.Authorization.RemoteKubeConfigFile = cfg.Kubeconfig
	// The front proxy's client CA is required: without it kube-apiserver's
	// proxied user would not be recognized.
	o.Authentication.TolerateInClusterLookupFailure = false
	if err := o.SecureServing.MaybeDefaultWithSelfSignedCerts("localhost", nil, []net.IP{net.IPv4(127, 0, 0, 1)}); err != nil {
		return nil, fmt.Errorf("output API: the serving certificate: %w", err)
	}
	rc := genericapiserver.NewRecommendedConfig(codecs)
	rc.EffectiveVersion = compatibility.NewEffectiveVersionFromString("1.37", "", "")
	rc.LongRunningFunc = LongRunning
	namer := openapinamer.NewDefinitionNamer(scheme)
	// The server needs the definitions even though it stores nothing:
	// server-side apply's type converter is built from them whether or not
	// a resource accepts writes.
	rc.OpenAPIConfig = genericapiserver.DefaultOpenAPIConfig(openapi.GetOpenAPIDefinitions, namer)
	rc.OpenAPIConfig.Info.Title, rc.OpenAPIConfig.Info.Version = outputv1alpha1.Group, outputv1alpha1.Version
	rc.OpenAPIV3Config = genericapiserver.DefaultOpenAPIV3Config(openapi.GetOpenAPIDefinitions, namer)
	rc.OpenAPIV3Config.Info.Title, rc.OpenAPIV3Config.Info.Version = outputv1alpha1.Group, outputv1alpha1.Version
	if err := o.ApplyTo(rc); err != nil {
		return nil, fmt.Errorf("output API: %w", err)
	}
	g, err := rc.Complete().New("bashtask-output-api", genericapiserver.NewEmptyDelegate())
	if err != nil {
		return nil, fmt.Errorf("output API: %w", err)
	}
	s := &Server{cfg: cfg, generic: g, dispatch: dispatchWaits{informers: cfg.Informers}, authz: rc.Authorization.Authorizer}
	if cfg.BucketURL != "" {
		if s.bucket, s.bucketBase, err = openBucket(ctx, cfg.BucketURL); err != nil {
			return nil, err
		}
	}
	info := genericapiserver.NewDefaultAPIGroupInfo(outputv1alpha1.Group, scheme, runtime.NewParameterCodec(scheme), codecs)
	info.VersionedResourcesStorageMap[outputv1alpha1.Version] = map[string]rest.Storage{
		"bashtasks":                  &bashTaskREST{s: s},
		"bashtasks/log":              &logREST{subresource: newSubresource("bashtask", func() runtime.Object { return &outputv1alpha1.LogOptions{} }, http.MethodGet), s: s},
		"bashtasks/stdin":            &stdinREST{subresource: newSubresource("bashtask", func() runtime.Object { return &outputv1alpha1.StdinOptions{} }, http.MethodPost), s: s},
		"bashtasks/attach":           &attachREST{subresource: newSubresource("bashtask", func() runtime.Object { return &outputv1alpha1.AttachOptions{} }, http.MethodGet), s: s},
		"bashworkspaces":             &bashWorkspaceREST{s: s},
		"bashworkspaces/portforward": &portForwardREST{subresource: newSubresource("bashworkspace", func() runtime.Object { return &outputv1alpha1.PortForwardOptions{} }, http.MethodGet, http.MethodPost), s: s},
	}
	if err := g.InstallAPIGroup(&info); err != nil {
		return nil, fmt.Errorf("output API: installing %s: %w", outputv1alpha1.SchemeGroupVersion, err)
	}
	return s, nil
}

// openBucket opens the bucket and returns the prefix of its objects' URLs
// as the agents write them into statuses (the URL without query, user
// information or fragment).
func openBucket(ctx context.Context, bucketURL string) (*blob.Bucket, string, error) {
	u, err := url.Parse(bucketURL)
	if err != nil {
		return nil, "", fmt.Errorf("parsing --output-bucket-url: %w", err)
	}
	u.RawQuery, u.Fragment, u.User = "", "", nil
	base := strings.TrimSuffix(u.String(), "/")
	b, err := blob.OpenBucket(ctx, bucketURL)
	if err != nil {
		return nil, "", fmt.Errorf("opening the output bucket %s: %w", base, err)
	}
	return b, base, nil
}

// Start serves until ctx ends (manager.Runnable; it runs on every replica,
// see NeedLeaderElection).
func (s *Server) Start(ctx context.Context) error {
	defer s.dispatch.stop()
	defer func() {
		if s.bucket != nil {
			_ = s.bucket.Close()
		}
	}()
	return s.generic.PrepareRun().RunWithContext(ctx)
}

// NeedLeaderElection is false: every replica serves output.
func (s *Server) NeedLeaderElection() bool { return false }
