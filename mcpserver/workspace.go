package mcpserver

import (
	"context"
	"fmt"
	"time"

	"github.com/google/jsonschema-go/jsonschema"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"k8s.io/utils/ptr"

	bashtaskv1alpha1 "github.com/bashtask/bashtask-operator/api/v1alpha1"
	btclient "github.com/bashtask/bashtask-operator/client"
)

// readyWait bounds how long workspace_create and workspace_resume wait
// for the workspace to be Ready.
const readyWait = 2 * time.Minute

// WorkspaceInput names a workspace.
type WorkspaceInput struct {
	Name string `json:"name" jsonschema:"the workspace's name (a DNS label: lower-case letters, digits and '-')"`
}

// CreateInput is workspace_create's input.
type CreateInput struct {
	Name    string `json:"name" jsonschema:"the new workspace's name (a DNS label: lower-case letters, digits and '-', at most 63)"`
	Storage string `json:"storage,omitempty" jsonschema:"disk quota of its files, a Kubernetes quantity such as 2Gi; empty: the cluster's default"`
	Network string `json:"network,omitempty" jsonschema:"Egress (outbound only, the default), None, or Node"`
	Image   string `json:"image,omitempty" jsonschema:"OCI image its commands run in, e.g. python:3.13; empty: the node's default"`
}

// WorkspaceOutput is a workspace as the tools report it.
type WorkspaceOutput struct {
	Name    string `json:"name"`
	Phase   string `json:"phase" jsonschema:"Pending, Ready, Suspended, Terminating, NodeLost, Failed, or Deleted"`
	Node    string `json:"node,omitempty" jsonschema:"the node it is on"`
	Message string `json:"message,omitempty"`
}

func workspaceOutput(ws *bashtaskv1alpha1.BashWorkspace) WorkspaceOutput {
	o := WorkspaceOutput{Name: ws.Name, Phase: string(ptr.Deref(ws.Status.Phase, "")), Node: ptr.Deref(ws.Status.NodeName, ""), Message: ptr.Deref(ws.Status.Message, "")}
	return o
}

// inputSchema is the schema of In that accepts and ignores properties it
// does not name (an "owner" a model adds is dropped, never refused or
// used).
func inputSchema[In any]() *jsonschema.Schema {
	s, err := jsonschema.For[In](nil)
	if err != nil {
		panic(err)
	}
	s.AdditionalProperties = nil
	return s
}

func (s *Server) addWorkspaceTools() {
	mcp.AddTool(s.mcp, &mcp.Tool{Name: "workspace_create", InputSchema: inputSchema[CreateInput](),
		Description: "Create a workspace: a persistent shell home (/home/task) on a cluster node where commands run with `bash -c`. " +
			"Files persist across commands. Waits until it is Ready (up to 2 minutes). Its owner is the server's; an owner you give is ignored."},
		s.createWorkspace)
	mcp.AddTool(s.mcp, &mcp.Tool{Name: "workspace_suspend", InputSchema: inputSchema[WorkspaceInput](),
		Description: "Suspend a workspace: snapshot its files and release its node. Waits until it is Suspended. Commands are refused until workspace_resume."},
		s.suspendWorkspace)
	mcp.AddTool(s.mcp, &mcp.Tool{Name: "workspace_resume", InputSchema: inputSchema[WorkspaceInput](),
		Description: "Resume a suspended workspace from its snapshot. Waits until it is Ready again."},
		s.resumeWorkspace)
	mcp.AddTool(s.mcp, &mcp.Tool{Name: "workspace_delete", InputSchema: inputSchema[WorkspaceInput](),
		Description: "Delete a workspace and all its files for good; its running commands are cancelled first. Waits until it is gone."},
		s.deleteWorkspace)
}

func (s *Server) createWorkspace(ctx context.Context, req *mcp.CallToolRequest, in CreateInput) (*mcp.CallToolResult, WorkspaceOutput, error) {
	c, err := s.client(req.Extra)
	if err != nil {
		return nil, WorkspaceOutput{}, err
	}
	if in.Name == "" {
		return nil, WorkspaceOutput{}, fmt.Errorf("name is required")
	}
	_, err = c.CreateWorkspace(ctx, btclient.WorkspaceOptions{Namespace: s.cfg.Namespace, Name: in.Name, Owner: s.cfg.Owner,
		Storage: in.Storage, Network: in.Network, Image: in.Image})
	if err != nil {
		return nil, WorkspaceOutput{}, explain(err)
	}
	wctx, cancel := context.WithTimeout(ctx, readyWait)
	defer cancel()
	ws, err := c.WaitWorkspaceReady(wctx, s.cfg.Namespace, in.Name)
	if err != nil {
		return nil, WorkspaceOutput{}, fmt.Errorf("workspace %s was created but is not Ready: %w", in.Name, explain(err))
	}
	return nil, workspaceOutput(ws), nil
}

// ownWorkspace reads the workspace and refuses one of another owner.
func (s *Server) ownWorkspace(ctx context.Context, c *btclient.Client, name string) error {
	if name == "" {
		return fmt.Errorf("name is required")
	}
	ws, err := c.GetWorkspace(ctx, s.cfg.Namespace, name)
	if err != nil {
		return explain(err)
	}
	if owner := ptr.Deref(ws.Spec.Owner, ""); owner != s.cfg.Owner {
		return fmt.Errorf("workspace %s belongs to owner %q, not to this server's owner %q: use a workspace of your own (workspace_create)", name, owner, s.cfg.Owner)
	}
	return nil
}

func (s *Server) suspendWorkspace(ctx context.Context, req *mcp.CallToolRequest, in WorkspaceInput) (*mcp.CallToolResult, WorkspaceOutput, error) {
	return s.workspaceVerb(ctx, req, in, func(c *btclient.Client) (*bashtaskv1alpha1.BashWorkspace, error) {
		return c.SuspendWorkspace(ctx, s.cfg.Namespace, in.Name)
	})
}

func (s *Server) resumeWorkspace(ctx context.Context, req *mcp.CallToolRequest, in WorkspaceInput) (*mcp.CallToolResult, WorkspaceOutput, error) {
	return s.workspaceVerb(ctx, req, in, func(c *btclient.Client) (*bashtaskv1alpha1.BashWorkspace, error) {
		wctx, cancel := context.WithTimeout(ctx, readyWait)
		defer cancel()
		return c.ResumeWorkspace(wctx, s.cfg.Namespace, in.Name)
	})
}

func (s *Server) deleteWorkspace(ctx context.Context, req *mcp.CallToolRequest, in WorkspaceInput) (*mcp.CallToolResult, WorkspaceOutput, error) {
	return s.workspaceVerb(ctx, req, in, func(c *btclient.Client) (*bashtaskv1alpha1.BashWorkspace, error) {
		if err := c.DeleteWorkspace(ctx, s.cfg.Namespace, in.Name); err != nil {
			return nil, err
		}
		ws := &bashtaskv1alpha1.BashWorkspace{}
		ws.Name, ws.Status.Phase = in.Name, ptr.To[bashtaskv1alpha1.WorkspacePhase]("Deleted")
		return ws, nil
	})
}

// workspaceVerb checks the workspace's owner, then does verb.
func (s *Server) workspaceVerb(ctx context.Context, req *mcp.CallToolRequest, in WorkspaceInput, verb func(*btclient.Client) (*bashtaskv1alpha1.BashWorkspace, error)) (*mcp.CallToolResult, WorkspaceOutput, error) {
	c, err := s.client(req.Extra)
	if err != nil {
		return nil, WorkspaceOutput{}, err
	}
	if err := s.ownWorkspace(ctx, c, in.Name); err != nil {
		return nil, WorkspaceOutput{}, err
	}
	ws, err := verb(c)
	if err != nil {
		return nil, WorkspaceOutput{}, explain(err)
	}
	return nil, workspaceOutput(ws), nil
}
