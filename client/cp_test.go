package client

import (
	"strings"
	"testing"
)

func TestWorkspacePath(t *testing.T) {
	for in, want := range map[string]string{
		"":                 "/home/task",
		".":                "/home/task",
		"src/a.go":         "/home/task/src/a.go",
		"/src":             "/home/task/src",
		"/home/task/src":   "/home/task/src",
		"/home/task":       "/home/task",
		"/home/tasks":      "/home/task/home/tasks",
		"../../etc/passwd": "/home/task/etc/passwd",
		"a/../../b":        "/home/task/b",
		"dir/":             "/home/task/dir",
	} {
		got, err := WorkspacePath(in)
		if err != nil || got != want {
			t.Errorf("WorkspacePath(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, bad := range []string{"a\x00b", "a\nb", strings.Repeat("a", 4096)} {
		if _, err := WorkspacePath(bad); err == nil {
			t.Errorf("WorkspacePath(%q...) took it", bad[:3])
		}
	}
}
