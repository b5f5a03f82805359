package executor

import (
	"strings"
	"testing"

	agentv1 "github.com/bashtask/bashtask-operator/api/agent/v1"
)

func TestArgEnvLimit(t *testing.T) {
	tests := map[string]struct {
		stack, want int64
	}{
		"default 8 MiB stack: a quarter":       {stack: 8 << 20, want: 2 << 20},
		"small stack: ARG_MAX at least":        {stack: 64 << 10, want: ArgMax},
		"large stack: three quarters of 8 MiB": {stack: 100 << 20, want: 6 << 20},
		"unlimited stack":                      {stack: -1, want: 6 << 20},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			if got := ArgEnvLimit(tc.stack); got != tc.want {
				t.Errorf("ArgEnvLimit(%d) = %d, want %d", tc.stack, got, tc.want)
			}
		})
	}
}

func TestArgEnvMessage(t *testing.T) {
	argv := []string{"/bin/bash", "-c", "true"}
	env := []string{"A=" + strings.Repeat("a", 100), "B=" + strings.Repeat("b", 300), "C=c", "D=" + strings.Repeat("d", 200)}
	// Strings with their NULs: the path 10, argv 10 + 3 + 5, env 103 +
	// 303 + 4 + 203: 641; pointers: 7 of 8 bytes.
	if got := argEnvSize("/bin/bash", argv, env); got != 641+56 {
		t.Fatalf("argEnvSize = %d, want %d", got, 641+56)
	}
	got := argEnvMessage("/bin/bash", argv, env, 1024)
	want := "environment and arguments total 697 bytes (4 environment entries, a command of 4 bytes), " +
		"refused by the kernel near its limit of 131072 bytes (ARG_MAX: a quarter of the stack size limit of 1024 bytes, between 131072 and 6291456); " +
		"the largest entries: B (302 bytes), D (202 bytes), A (102 bytes)"
	if got != want {
		t.Errorf("message\n got %q\nwant %q", got, want)
	}
}

// TestArgEnvBytesMatchesTheExecutor checks that what the controller measures
// before sending a task (agentv1.ArgEnvBytes) is what the executor counts
// against the same limit for the task's own part of the environment.
func TestArgEnvBytesMatchesTheExecutor(t *testing.T) {
	spec := &agentv1.TaskSpec{
		Command: "echo " + strings.Repeat("x", 5000),
		Env: []*agentv1.EnvVar{
			{Name: "A", Value: strings.Repeat("a", 1000)},
			{Name: "B", Value: ""},
			{Name: "A", Value: "later wins"},
		},
		ManagedEnv: []*agentv1.EnvVar{{Name: "BASHTASK_NODE", Value: "node-a"}},
	}
	env := []string{"B=", "A=later wins", "BASHTASK_NODE=node-a"}
	shell := "/bin/bash"
	want := argEnvSize(shell, []string{shell, "-c", spec.GetCommand()}, env)
	if got := agentv1.ArgEnvBytes(spec, shell); got != want {
		t.Errorf("ArgEnvBytes = %d, the executor counts %d", got, want)
	}
}
