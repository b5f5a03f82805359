package mcpserver

import (
	"context"
	"fmt"
	"regexp"
	"strings"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"k8s.io/utils/ptr"

	bashtaskv1alpha1 "github.com/bashtask/bashtask-operator/api/v1alpha1"
	btclient "github.com/bashtask/bashtask-operator/client"
)

// MaxForkCount is the most copies one workspace_fork call makes, fewer
// than the Go client's client.MaxForkCount (64): each copy holds the
// source's files and takes its own node resources, and every copy is
// waited for within one readyWait (docs/mcp.md).
const MaxForkCount = 16

// maxNamePrefix is the longest name_prefix, in characters: the API server
// appends 5 random characters to a generateName and a workspace's name is
// a DNS label of at most 63.
const maxNamePrefix = 58

// namePrefixRE is what a name_prefix may hold: the start of a DNS label.
var namePrefixRE = regexp.MustCompile(`^[a-z0-9][-a-z0-9]*$`)

// ForkInput is workspace_fork's input.
type ForkInput struct {
	Source     string `json:"source" jsonschema:"the workspace to copy (yours, Ready or Suspended); it keeps running"`
	Count      int    `json:"count,omitempty" jsonschema:"how many copies to make, 1 to 16; 0 or absent: 1"`
	NamePrefix string `json:"name_prefix,omitempty" jsonschema:"start of the copies' names, followed by 5 random characters (lower-case letters, digits and '-', at most 58); empty: SOURCE-fork-"`
}

// ForkOutput is workspace_fork's result.
type ForkOutput struct {
	Source     string            `json:"source"`
	Workspaces []WorkspaceOutput `json:"workspaces" jsonschema:"the copies, in the order made, each Ready: use their names in run, read_file, ..."`
}

func (s *Server) addForkTool() {
	mcp.AddTool(s.mcp, &mcp.Tool{Name: "workspace_fork", InputSchema: inputSchema[ForkInput](),
		Description: "Copy a workspace into 1 to 16 new workspaces: each starts with the source's files, working directory and carried variables " +
			"as of one instant, then goes its own way (its own files, network and quota; the source keeps running). " +
			"Use it to try different changes side by side (best-of-N, a risky change in a copy). Waits until every copy is Ready (up to 2 minutes) " +
			"and returns their names. The copies' owner is the server's; an owner you give is ignored."},
		s.forkWorkspace)
}

// forkOptions are the client's options of in, or an error naming the
// field and its bound.
func (s *Server) forkOptions(in ForkInput) (btclient.ForkOptions, error) {
	if in.Source == "" {
		return btclient.ForkOptions{}, fmt.Errorf("source is required: the name of the workspace to copy")
	}
	if in.Count < 0 || in.Count > MaxForkCount {
		return btclient.ForkOptions{}, fmt.Errorf("count %d is out of range: 1 to %d copies per call (call workspace_fork again for more)", in.Count, MaxForkCount)
	}
	if p := in.NamePrefix; p != "" && (len(p) > maxNamePrefix || !namePrefixRE.MatchString(p)) {
		return btclient.ForkOptions{}, fmt.Errorf("name_prefix %q: lower-case letters, digits and '-', starting with a letter or digit, at most %d characters", p, maxNamePrefix)
	}
	return btclient.ForkOptions{Namespace: s.cfg.Namespace, Source: in.Source, Count: max(in.Count, 1), NamePrefix: in.NamePrefix}, nil
}

func (s *Server) forkWorkspace(ctx context.Context, req *mcp.CallToolRequest, in ForkInput) (*mcp.CallToolResult, ForkOutput, error) {
	opts, err := s.forkOptions(in)
	if err != nil {
		return nil, ForkOutput{}, err
	}
	c, err := s.client(req.Extra)
	if err != nil {
		return nil, ForkOutput{}, err
	}
	if err := s.ownWorkspace(ctx, c, in.Source); err != nil {
		return nil, ForkOutput{}, err
	}
	wctx, cancel := context.WithTimeout(ctx, readyWait)
	defer cancel()
	forks, err := c.Fork(wctx, opts)
	if err != nil {
		return nil, ForkOutput{}, forkError(ctx, c, in.Source, forks, err)
	}
	out := ForkOutput{Source: in.Source}
	for _, ws := range forks {
		out.Workspaces = append(out.Workspaces, workspaceOutput(ws))
	}
	return nil, out, nil
}

// forkError is a failed fork's tool error: what went wrong, and the
// copies already made with their phases now, for the model to use or
// delete.
func forkError(ctx context.Context, c *btclient.Client, source string, forks []*bashtaskv1alpha1.BashWorkspace, err error) error {
	err = fmt.Errorf("forking workspace %s: %w", source, explain(err))
	if len(forks) == 0 {
		return err
	}
	made := make([]string, 0, len(forks))
	for _, ws := range forks {
		phase := "phase unknown"
		if now, gerr := c.GetWorkspace(ctx, ws.Namespace, ws.Name); gerr == nil {
			phase = string(ptr.Deref(now.Status.Phase, bashtaskv1alpha1.WorkspacePending))
		}
		made = append(made, ws.Name+" ("+phase+")")
	}
	return fmt.Errorf("%w; copies made: %s (delete the ones you do not use with workspace_delete)", err, strings.Join(made, ", "))
}
