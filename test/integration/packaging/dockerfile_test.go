package packaging_test

import (
	"bufio"
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// TestDockerfile stands in for building the images where no container
// engine runs: every COPY source exists in the repository or is an earlier
// stage, the copied directories hold every package the three binaries are
// built from (the plugin's too, for the MCP server's image), .dockerignore lets them through, and the targets the Makefile
// builds exist.
func TestDockerfile(t *testing.T) {
	data, err := os.ReadFile(filepath.Join(root, "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	var (
		stages  []string
		sources []string
	)
	fromRE := regexp.MustCompile(`(?i)^FROM\s+(?:--platform=\S+\s+)?\S+(?:\s+AS\s+(\S+))?$`)
	for _, line := range instructions(data) {
		fields := strings.Fields(line)
		switch strings.ToUpper(fields[0]) {
		case "FROM":
			m := fromRE.FindStringSubmatch(line)
			if m == nil {
				t.Errorf("cannot parse %q", line)
				continue
			}
			stages = append(stages, strings.ToLower(m[1]))
		case "ADD":
			t.Errorf("ADD in %q: use COPY", line)
		case "COPY":
			args := fields[1:]
			from := ""
			for len(args) > 0 && strings.HasPrefix(args[0], "--") {
				if v, ok := strings.CutPrefix(args[0], "--from="); ok {
					from = strings.ToLower(v)
				}
				args = args[1:]
			}
			if len(args) < 2 {
				t.Errorf("COPY without source and destination: %q", line)
				continue
			}
			if from != "" {
				// Only earlier stages: the current one is the last appended.
				if !slices.Contains(stages[:len(stages)-1], from) {
					t.Errorf("%q copies from %q, not an earlier stage of %v", line, from, stages)
				}
				continue
			}
			for _, src := range args[:len(args)-1] {
				src = strings.TrimSuffix(src, "/")
				if _, err := os.Stat(filepath.Join(root, src)); err != nil {
					t.Errorf("%q: source %s: %v", line, src, err)
				}
				sources = append(sources, src)
			}
		}
	}

	// The Makefile's docker-build loops over the targets it builds.
	mk, err := os.ReadFile(filepath.Join(root, "Makefile"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`for target in ([a-z ]+); do`).FindSubmatch(mk)
	if m == nil {
		t.Fatalf("Makefile: no docker-build target loop")
	}
	for _, target := range strings.Fields(string(m[1])) {
		if !slices.Contains(stages, target) {
			t.Errorf("Makefile builds target %s; Dockerfile stages are %v", target, stages)
		}
	}

	// Every package of the module the binaries need is under a copied
	// directory.
	cmd := exec.CommandContext(t.Context(), "go", "list", "-deps", "-f", "{{if .Module}}{{if .Module.Main}}{{.Dir}}{{end}}{{end}}",
		"./cmd/bashtask-controller", "./cmd/bashtask-agent", "./cmd/bashtask-shim", "./cmd/kubectl-bashtask")
	cmd.Dir = root
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	for dir := range strings.FieldsSeq(string(out)) {
		rel, err := filepath.Rel(root, dir)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.ContainsFunc(sources, func(src string) bool { return rel == src || strings.HasPrefix(rel, src+"/") }) {
			t.Errorf("package directory %s is not copied into the build stage (copied: %v)", rel, sources)
		}
	}

	// .dockerignore excludes everything and lets the copied paths through.
	ignore, err := os.ReadFile(filepath.Join(root, ".dockerignore"))
	if err != nil {
		t.Fatal(err)
	}
	for _, src := range sources {
		if !bytes.Contains(ignore, []byte("!"+src)) {
			t.Errorf(".dockerignore does not let %s through", src)
		}
	}
}

// instructions returns the Dockerfile's instructions with continuation
// lines joined and comments dropped.
func instructions(data []byte) []string {
	var out []string
	var cur strings.Builder
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		if s, ok := strings.CutSuffix(line, `\`); ok {
			cur.WriteString(s + " ")
			continue
		}
		cur.WriteString(line)
		out = append(out, cur.String())
		cur.Reset()
	}
	return out
}
