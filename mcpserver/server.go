// Package mcpserver is the Model Context Protocol server of `kubectl
// bashtask mcp`: tools that create, fork, suspend, resume and delete
// BashWorkspaces, run and start commands in them, read their output by
// byte offset, write their standard input, cancel them, and read, write
// and list files, plus each workspace's files as resources. It is built on
// the official Go SDK (github.com/modelcontextprotocol/go-sdk) and serves
// stdio or Streamable HTTP.
//
// It acts as its caller and never as a more powerful identity: over stdio
// with the caller's kubeconfig, over HTTP with the bearer token of each
// request, which the API server authenticates and RBAC authorizes as it
// does for kubectl. The owner of every workspace and task it touches is
// fixed when it starts (Config.Owner); a model cannot name another.
// docs/mcp.md is the user's guide.
package mcpserver

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/auth"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	authnv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	btclient "github.com/bashtask/bashtask-operator/client"
)

// Config is what the server is started with.
type Config struct {
	// REST is the API server to talk to. Over stdio it carries the
	// caller's credentials (the kubeconfig); over HTTP its credentials
	// are dropped and each request's bearer token is used instead.
	REST *rest.Config
	// Namespace holds the workspaces and tasks of every tool.
	Namespace string
	// Owner is spec.owner of every workspace the server creates and every
	// task it starts, and the only owner whose workspaces and tasks it
	// touches. Required.
	Owner string
	// Version is reported to clients as the server's version.
	Version string
}

// Server serves the tools of one namespace and owner.
type Server struct {
	cfg   Config
	mcp   *mcp.Server
	stdio *btclient.Client

	mu      sync.Mutex
	byToken map[string]*btclient.Client
}

// maxCachedTokens bounds the per-token clients an HTTP server keeps; past
// it the cache starts again empty.
const maxCachedTokens = 256

// New returns a server for cfg. An empty Owner or Namespace is an error
// naming the flag.
func New(cfg Config) (*Server, error) {
	if cfg.Owner == "" {
		return nil, errors.New("--owner is required: the owner of every workspace and task the server touches")
	}
	if cfg.Namespace == "" {
		return nil, errors.New("a namespace is required (-n or the kubeconfig context's)")
	}
	s := &Server{cfg: cfg, byToken: map[string]*btclient.Client{}}
	s.mcp = mcp.NewServer(&mcp.Implementation{Name: "bashtask", Title: "BashTask workspaces", Version: cfg.Version}, &mcp.ServerOptions{
		Instructions: instructions(cfg),
	})
	s.addWorkspaceTools()
	s.addForkTool()
	s.addRunTools()
	s.addOutputTools()
	s.addFileTools()
	s.addResources()
	return s, nil
}

// instructions is the server's note to the model at initialization.
func instructions(cfg Config) string {
	return fmt.Sprintf("Shell workspaces of owner %q in namespace %q. Create a workspace (workspace_create), "+
		"then run commands in it (run), or start long ones (start) and read their output by byte offset (read_output). "+
		"To try changes side by side, copy a workspace with workspace_fork. "+
		"Files: write_file, read_file, list_dir; paths are relative to the workspace's home, /home/task. "+
		"Files persist across commands; the working directory and exported variables may too.", cfg.Owner, cfg.Namespace)
}

// ServeStdio serves one session over r and w (newline-delimited JSON-RPC)
// with the REST config's own credentials, until the client closes r or
// ctx ends.
func (s *Server) ServeStdio(ctx context.Context, r io.ReadCloser, w io.WriteCloser) error {
	c, err := btclient.New(s.cfg.REST)
	if err != nil {
		return err
	}
	s.stdio = c
	err = s.mcp.Run(ctx, &mcp.IOTransport{Reader: r, Writer: w})
	if errors.Is(err, io.EOF) || ctx.Err() != nil {
		return nil
	}
	return err
}

// Handler is the Streamable HTTP endpoint: every request needs an
// "Authorization: Bearer TOKEN" header whose token the API server
// authenticates (a SelfSubjectReview made with it); each tool call then
// runs with that token, so RBAC decides as for kubectl.
func (s *Server) Handler() http.Handler {
	h := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return s.mcp }, nil)
	return auth.RequireBearerToken(s.verify, &auth.RequireBearerTokenOptions{AllowMissingExpiration: true})(h)
}

// ServeHTTP listens on addr and serves Handler until ctx ends.
func (s *Server) ServeHTTP(ctx context.Context, addr string) error {
	srv := &http.Server{Addr: addr, Handler: s.Handler(), ReadHeaderTimeout: 10 * time.Second}
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}()
	if err := srv.ListenAndServe(); !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// verify authenticates token with the API server: a SelfSubjectReview,
// which every authenticated identity may create, made with the token. An
// unknown token is auth.ErrInvalidToken (HTTP 401).
func (s *Server) verify(ctx context.Context, token string, _ *http.Request) (*auth.TokenInfo, error) {
	cs, err := kubernetes.NewForConfig(s.tokenConfig(token))
	if err != nil {
		return nil, err
	}
	rev, err := cs.AuthenticationV1().SelfSubjectReviews().Create(ctx, &authnv1.SelfSubjectReview{}, metav1.CreateOptions{})
	if err != nil {
		return nil, fmt.Errorf("%w: the API server did not authenticate the bearer token: %w", auth.ErrInvalidToken, err)
	}
	return &auth.TokenInfo{UserID: rev.Status.UserInfo.Username, Extra: map[string]any{tokenKey: token}}, nil
}

// tokenKey holds the bearer token in auth.TokenInfo.Extra.
const tokenKey = "token"

// tokenConfig is the REST config without its own credentials and with
// token as the bearer token.
func (s *Server) tokenConfig(token string) *rest.Config {
	cfg := rest.AnonymousClientConfig(s.cfg.REST)
	cfg.BearerToken = token
	cfg.UserAgent = "kubectl-bashtask-mcp"
	return cfg
}

// client is the API client of a request: the caller's kubeconfig over
// stdio, the request's bearer token over HTTP.
func (s *Server) client(extra *mcp.RequestExtra) (*btclient.Client, error) {
	if extra == nil || extra.TokenInfo == nil {
		if s.stdio == nil {
			return nil, errors.New("no credentials: over HTTP every request needs a bearer token")
		}
		return s.stdio, nil
	}
	token, _ := extra.TokenInfo.Extra[tokenKey].(string)
	s.mu.Lock()
	defer s.mu.Unlock()
	if c, ok := s.byToken[token]; ok {
		return c, nil
	}
	c, err := btclient.New(s.tokenConfig(token))
	if err != nil {
		return nil, err
	}
	if len(s.byToken) >= maxCachedTokens {
		s.byToken = map[string]*btclient.Client{}
	}
	s.byToken[token] = c
	return c, nil
}
