package mcpserver

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	btclient "github.com/bashtask/bashtask-operator/client"
)

// Bounds of the file tools, in bytes and entries.
const (
	defaultReadFileBytes = 256 << 10
	maxFileBytes         = 1 << 20
	defaultListEntries   = 500
	maxListEntries       = 5000
)

// FileInput is read_file's input.
type FileInput struct {
	Workspace string `json:"workspace"`
	Path      string `json:"path" jsonschema:"the file, relative to the workspace's home /home/task (or absolute with the home as /)"`
	Encoding  string `json:"encoding,omitempty" jsonschema:"text (the default: a file that is not UTF-8 is refused) or base64 (any bytes)"`
	MaxBytes  int    `json:"max_bytes,omitempty" jsonschema:"at most this many bytes; 0: 262144; at most 1048576. A larger file is refused"`
}

// FileOutput is a file's content.
type FileOutput struct {
	Path     string `json:"path"`
	Content  string `json:"content"`
	Encoding string `json:"encoding"`
	Size     int64  `json:"size" jsonschema:"bytes"`
}

// WriteFileInput is write_file's input.
type WriteFileInput struct {
	Workspace  string `json:"workspace"`
	Path       string `json:"path" jsonschema:"the file, relative to the workspace's home /home/task; its directory must exist (run mkdir -p first); an existing file is replaced"`
	Content    string `json:"content" jsonschema:"the file's content, at most 1048576 bytes"`
	Encoding   string `json:"encoding,omitempty" jsonschema:"text (the default) or base64"`
	Executable bool   `json:"executable,omitempty" jsonschema:"make the file executable (mode 0755 instead of 0644)"`
}

// WriteFileOutput says what was written.
type WriteFileOutput struct {
	Path string `json:"path"`
	Size int    `json:"size" jsonschema:"bytes written"`
}

// ListInput is list_dir's input.
type ListInput struct {
	Workspace  string `json:"workspace"`
	Path       string `json:"path,omitempty" jsonschema:"the directory, relative to the workspace's home /home/task; empty: the home"`
	MaxEntries int    `json:"max_entries,omitempty" jsonschema:"at most this many entries; 0: 500; at most 5000"`
}

// Entry is one directory entry.
type Entry struct {
	Name string `json:"name"`
	Type string `json:"type" jsonschema:"file, dir, symlink or other"`
	Size int64  `json:"size" jsonschema:"bytes"`
	Mode string `json:"mode" jsonschema:"permission bits in octal"`
}

// ListOutput is a directory's entries.
type ListOutput struct {
	Path      string  `json:"path"`
	Entries   []Entry `json:"entries"`
	Truncated bool    `json:"truncated" jsonschema:"more entries than max_entries"`
}

func (s *Server) addFileTools() {
	mcp.AddTool(s.mcp, &mcp.Tool{Name: "read_file", InputSchema: inputSchema[FileInput](),
		Description: "Read a file of a workspace (at most 1 MiB). Text by default; a binary file is refused unless encoding is base64."},
		s.readFile)
	mcp.AddTool(s.mcp, &mcp.Tool{Name: "write_file", InputSchema: inputSchema[WriteFileInput](),
		Description: "Write a file in a workspace (at most 1 MiB), replacing any file of that name. Its directory must exist."},
		s.writeFile)
	mcp.AddTool(s.mcp, &mcp.Tool{Name: "list_dir", InputSchema: inputSchema[ListInput](),
		Description: "List a directory of a workspace: name, type, size and mode of each entry, sorted by name."},
		s.listDir)
}

func (s *Server) readFile(ctx context.Context, req *mcp.CallToolRequest, in FileInput) (*mcp.CallToolResult, FileOutput, error) {
	c, err := s.client(req.Extra)
	if err != nil {
		return nil, FileOutput{}, err
	}
	if in.Encoding != "" && in.Encoding != encodingText && in.Encoding != encodingBase64 {
		return nil, FileOutput{}, fmt.Errorf("encoding %q: text or base64", in.Encoding)
	}
	b, err := s.fetchFile(ctx, c, in.Workspace, in.Path, clamp(in.MaxBytes, defaultReadFileBytes, maxFileBytes))
	if err != nil {
		return nil, FileOutput{}, err
	}
	o := FileOutput{Path: in.Path, Size: int64(len(b)), Encoding: encodingBase64, Content: base64.StdEncoding.EncodeToString(b)}
	if in.Encoding != encodingBase64 {
		if !utf8.Valid(b) {
			return nil, FileOutput{}, fmt.Errorf("%s is a binary file (not UTF-8 text): read it with encoding base64", in.Path)
		}
		o.Content, o.Encoding = string(b), encodingText
	}
	return nil, o, nil
}

// fetchFile copies a file out of the workspace (CopyFrom, the copy path
// of `kubectl bashtask cp`) and returns its bytes, refusing a directory
// or one over limit bytes.
func (s *Server) fetchFile(ctx context.Context, c *btclient.Client, workspace, p string, limit int) ([]byte, error) {
	if workspace == "" || p == "" {
		return nil, errors.New("workspace and path are required")
	}
	if err := s.ownWorkspace(ctx, c, workspace); err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "bashtask-mcp-")
	if err != nil {
		return nil, err
	}
	defer func() { _ = os.RemoveAll(dir) }()
	local := filepath.Join(dir, "f")
	if err := c.CopyFrom(ctx, s.cfg.Namespace, workspace, p, local, btclient.CopyOptions{}); err != nil {
		return nil, explain(err)
	}
	fi, err := os.Lstat(local)
	switch {
	case err != nil:
		return nil, err
	case fi.IsDir():
		return nil, fmt.Errorf("%s is a directory: list it with list_dir", p)
	case !fi.Mode().IsRegular():
		return nil, fmt.Errorf("%s is not a regular file (%s)", p, fi.Mode().Type())
	case fi.Size() > int64(limit):
		return nil, fmt.Errorf("%s is %d bytes, over the limit of %d (max_bytes, at most %d): read parts of it with run (head -c, tail -c, sed -n)", p, fi.Size(), limit, maxFileBytes)
	}
	return os.ReadFile(local)
}

func (s *Server) writeFile(ctx context.Context, req *mcp.CallToolRequest, in WriteFileInput) (*mcp.CallToolResult, WriteFileOutput, error) {
	c, err := s.client(req.Extra)
	if err != nil {
		return nil, WriteFileOutput{}, err
	}
	data, err := fileContent(in)
	if err != nil {
		return nil, WriteFileOutput{}, err
	}
	if err := s.ownWorkspace(ctx, c, in.Workspace); err != nil {
		return nil, WriteFileOutput{}, err
	}
	dir, err := os.MkdirTemp("", "bashtask-mcp-")
	if err != nil {
		return nil, WriteFileOutput{}, err
	}
	defer func() { _ = os.RemoveAll(dir) }()
	mode := os.FileMode(0o644)
	if in.Executable {
		mode = 0o755
	}
	local := filepath.Join(dir, path.Base(in.Path))
	if err := os.WriteFile(local, data, mode); err != nil {
		return nil, WriteFileOutput{}, err
	}
	if err := os.Chmod(local, mode); err != nil {
		return nil, WriteFileOutput{}, err
	}
	if err := c.CopyTo(ctx, s.cfg.Namespace, in.Workspace, local, in.Path, btclient.CopyOptions{}); err != nil {
		return nil, WriteFileOutput{}, explain(err)
	}
	return nil, WriteFileOutput{Path: in.Path, Size: len(data)}, nil
}

// fileContent decodes and bounds write_file's content.
func fileContent(in WriteFileInput) ([]byte, error) {
	if in.Workspace == "" || in.Path == "" {
		return nil, errors.New("workspace and path are required")
	}
	if b := path.Base(path.Clean("/" + in.Path)); b == "/" || b == "." || b == ".." {
		return nil, fmt.Errorf("path %q names no file", in.Path)
	}
	data := []byte(in.Content)
	switch in.Encoding {
	case "", encodingText:
	case encodingBase64:
		var err error
		if data, err = base64.StdEncoding.DecodeString(in.Content); err != nil {
			return nil, fmt.Errorf("content is not base64: %w", err)
		}
	default:
		return nil, fmt.Errorf("encoding %q: text or base64", in.Encoding)
	}
	if len(data) > maxFileBytes {
		return nil, fmt.Errorf("content is %d bytes, over the limit of %d: write it in parts, or fetch it from within the workspace", len(data), maxFileBytes)
	}
	return data, nil
}

func (s *Server) listDir(ctx context.Context, req *mcp.CallToolRequest, in ListInput) (*mcp.CallToolResult, ListOutput, error) {
	c, err := s.client(req.Extra)
	if err != nil {
		return nil, ListOutput{}, err
	}
	if in.Workspace == "" {
		return nil, ListOutput{}, errors.New("workspace is required")
	}
	dir, err := btclient.WorkspacePath(in.Path)
	if err != nil {
		return nil, ListOutput{}, err
	}
	limit := clamp(in.MaxEntries, defaultListEntries, maxListEntries)
	// One line per entry: type, size, mode, name; names with a newline
	// are left out (they could not be told apart).
	cmd := fmt.Sprintf(`cd -- %s || exit 2; LC_ALL=C find . -mindepth 1 -maxdepth 1 ! -name '*
*' -printf '%%y\t%%s\t%%m\t%%P\n' | LC_ALL=C sort -t "$(printf '\t')" -k4 | head -n %d`, shellQuote(dir), limit+1)
	var out tailBuffer
	out.max = maxFileBytes
	var errOut tailBuffer
	errOut.max = 4096
	res, err := c.Run(ctx, btclient.RunOptions{Namespace: s.cfg.Namespace, Workspace: in.Workspace, Owner: s.cfg.Owner, Command: cmd,
		GenerateName: "mcp-ls-", Stdout: &out, Stderr: &errOut})
	if err != nil {
		return nil, ListOutput{}, explain(err)
	}
	if res.ExitCode != 0 {
		msg, _, _ := errOut.snapshot()
		return nil, ListOutput{}, fmt.Errorf("listing %s: %s %s", in.Path, res.Reason, strings.TrimSpace(string(msg)))
	}
	b, _, _ := out.snapshot()
	return nil, listOutput(in.Path, string(b), limit), nil
}

// listOutput parses list_dir's lines.
func listOutput(p, lines string, limit int) ListOutput {
	o := ListOutput{Path: p, Entries: []Entry{}}
	for line := range strings.Lines(lines) {
		f := strings.SplitN(strings.TrimSuffix(line, "\n"), "\t", 4)
		if len(f) != 4 {
			continue
		}
		if len(o.Entries) == limit {
			o.Truncated = true
			break
		}
		size, _ := strconv.ParseInt(f[1], 10, 64)
		o.Entries = append(o.Entries, Entry{Name: f[3], Type: entryType(f[0]), Size: size, Mode: f[2]})
	}
	return o
}

func entryType(y string) string {
	switch y {
	case "f":
		return "file"
	case "d":
		return "dir"
	case "l":
		return "symlink"
	}
	return "other"
}

// shellQuote quotes s for bash as one word.
func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }
