package mcpserver

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"k8s.io/client-go/rest"
)

func TestNewNeedsOwnerAndNamespace(t *testing.T) {
	if _, err := New(Config{REST: &rest.Config{}, Namespace: "a"}); err == nil || !strings.Contains(err.Error(), "--owner") {
		t.Errorf("no owner: %v, want an error naming --owner", err)
	}
	if _, err := New(Config{REST: &rest.Config{}, Owner: "o"}); err == nil || !strings.Contains(err.Error(), "namespace") {
		t.Errorf("no namespace: %v, want an error naming the namespace", err)
	}
}

// TestInputSchemaIgnoresOwner: the schemas name no owner and allow
// properties they do not name, so that an owner a model adds is dropped,
// not refused.
func TestInputSchemaIgnoresOwner(t *testing.T) {
	for name, s := range map[string]any{"run": inputSchema[RunInput](), "create": inputSchema[CreateInput](), "file": inputSchema[WriteFileInput]()} {
		raw, _ := json.Marshal(s)
		if strings.Contains(string(raw), `"owner"`) || strings.Contains(string(raw), `"additionalProperties":false`) {
			t.Errorf("%s's schema names an owner or refuses other properties: %s", name, raw)
		}
	}
}

func TestTailBuffer(t *testing.T) {
	tb := &tailBuffer{max: 4}
	_, _ = tb.Write([]byte("abc"))
	_, _ = tb.Write([]byte("defg"))
	b, off, total := tb.snapshot()
	if string(b) != "defg" || off != 3 || total != 7 {
		t.Errorf("tail %q at %d of %d, want defg at 3 of 7", b, off, total)
	}
	// A tail cut inside a character starts at the next whole one.
	tb = &tailBuffer{max: 3}
	_, _ = tb.Write([]byte("aé€")) // a, é (2 bytes), € (3 bytes)
	data, enc, off, total := tailOf(tb)
	if data != "€" || enc != encodingText || off != 3 || total != 6 {
		t.Errorf("tailOf: %q %s at %d of %d, want € as text at 3 of 6", data, enc, off, total)
	}
	if _, enc := encode([]byte{0xff}); enc != encodingBase64 {
		t.Errorf("bytes that are not UTF-8 encoded as %s, want base64", enc)
	}
}

func TestListOutput(t *testing.T) {
	o := listOutput("p", "d\t4096\t755\tsrc\nf\t3\t644\ta b.txt\nl\t5\t777\tlink\n", 2)
	if len(o.Entries) != 2 || !o.Truncated || o.Entries[0] != (Entry{Name: "src", Type: "dir", Size: 4096, Mode: "755"}) || o.Entries[1].Name != "a b.txt" {
		t.Errorf("listOutput: %+v", o)
	}
}

func TestFileContentBounds(t *testing.T) {
	if _, err := fileContent(WriteFileInput{Workspace: "w", Path: "x", Content: strings.Repeat("a", maxFileBytes+1)}); err == nil || !strings.Contains(err.Error(), "over the limit") {
		t.Errorf("content over 1 MiB: %v", err)
	}
	if _, err := fileContent(WriteFileInput{Workspace: "w", Path: "/", Content: "a"}); err == nil {
		t.Error("path / was taken as a file")
	}
	if b, err := fileContent(WriteFileInput{Workspace: "w", Path: "x", Content: "AP8=", Encoding: "base64"}); err != nil || string(b) != "\x00\xff" {
		t.Errorf("base64 content: %q %v", b, err)
	}
}

// TestForkInputRefusals: workspace_fork refuses a missing source, a count
// out of 1..MaxForkCount and a name prefix that cannot start a workspace's
// name, as tool errors naming the field and the bound, before any API
// call (the server here has no cluster).
func TestForkInputRefusals(t *testing.T) {
	srv, err := New(Config{REST: &rest.Config{Host: "http://127.0.0.1:1"}, Namespace: "ns", Owner: "o1"})
	if err != nil {
		t.Fatal(err)
	}
	ct, st := mcp.NewInMemoryTransports()
	if _, err := srv.mcp.Connect(t.Context(), st, nil); err != nil {
		t.Fatal(err)
	}
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "v0"}, nil).Connect(t.Context(), ct, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cs.Close() }()
	for _, c := range []struct {
		args map[string]any
		want string
	}{
		{map[string]any{"count": 2}, `missing properties: ["source"]`},
		{map[string]any{"source": "w", "count": MaxForkCount + 1}, "count 17 is out of range: 1 to 16 copies"},
		{map[string]any{"source": "w", "count": -1}, "count -1 is out of range"},
		{map[string]any{"source": "w", "name_prefix": "Try_"}, `name_prefix "Try_"`},
		{map[string]any{"source": "w", "name_prefix": strings.Repeat("a", 59)}, "at most 58 characters"},
	} {
		res, err := cs.CallTool(t.Context(), &mcp.CallToolParams{Name: "workspace_fork", Arguments: c.args})
		if err != nil {
			t.Fatalf("workspace_fork %v: %v, want a tool error", c.args, err)
		}
		text := ""
		for _, content := range res.Content {
			if tc, ok := content.(*mcp.TextContent); ok {
				text += tc.Text
			}
		}
		if !res.IsError || !strings.Contains(text, c.want) {
			t.Errorf("workspace_fork %v: isError %v, %q; want a tool error containing %q", c.args, res.IsError, text, c.want)
		}
	}
}

// TestForkOptions: the client's options of a valid input carry the
// server's namespace, and a count of 0 is one copy.
func TestForkOptions(t *testing.T) {
	s := &Server{cfg: Config{Namespace: "ns", Owner: "o1"}}
	o, err := s.forkOptions(ForkInput{Source: "w", NamePrefix: "try-"})
	if err != nil || o.Namespace != "ns" || o.Source != "w" || o.Count != 1 || o.NamePrefix != "try-" {
		t.Errorf("forkOptions: %+v %v", o, err)
	}
	raw, _ := json.Marshal(inputSchema[ForkInput]())
	if strings.Contains(string(raw), `"owner"`) || !strings.Contains(string(raw), `"source"`) {
		t.Errorf("workspace_fork's schema: %s", raw)
	}
}
