package mcpserver

import (
	"context"
	"fmt"
	"mime"
	"net/url"
	"path"
	"strings"
	"unicode/utf8"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// resourceScheme is the URI scheme of workspace files:
// bashtask://WORKSPACE/PATH, PATH relative to the workspace's home.
const resourceScheme = "bashtask"

func (s *Server) addResources() {
	s.mcp.AddResourceTemplate(&mcp.ResourceTemplate{
		Name:        "workspace-file",
		Title:       "A file of a workspace",
		URITemplate: resourceScheme + "://{workspace}/{+path}",
		Description: "A file of a workspace, PATH relative to its home /home/task (at most 1 MiB); text files as text, others as a blob.",
	}, s.readResource)
}

func (s *Server) readResource(ctx context.Context, req *mcp.ReadResourceRequest) (*mcp.ReadResourceResult, error) {
	u, err := url.Parse(req.Params.URI)
	if err != nil || u.Scheme != resourceScheme || u.Host == "" || strings.Trim(u.Path, "/") == "" {
		return nil, mcp.ResourceNotFoundError(req.Params.URI)
	}
	c, err := s.client(req.Extra)
	if err != nil {
		return nil, err
	}
	b, err := s.fetchFile(ctx, c, u.Host, strings.TrimPrefix(u.Path, "/"), maxFileBytes)
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", req.Params.URI, err)
	}
	rc := &mcp.ResourceContents{URI: req.Params.URI, MIMEType: mime.TypeByExtension(path.Ext(u.Path))}
	if utf8.Valid(b) {
		rc.Text = string(b)
		if rc.MIMEType == "" {
			rc.MIMEType = "text/plain"
		}
	} else {
		rc.Blob = b
	}
	return &mcp.ReadResourceResult{Contents: []*mcp.ResourceContents{rc}}, nil
}
