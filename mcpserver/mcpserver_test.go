package mcpserver

import (
	"encoding/json"
	"strings"
	"testing"

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
