package agent

import (
	"testing"

	"github.com/bashtask/bashtask-operator/executor"
)

// An agent at the tenant level that names no --ambient-env passes none of
// its variables to tasks (the allowlist mode, empty), and says so in its
// readiness; PATH is the executor's fixed default.
func TestTenantAgentPassesNoVariableOfItsOwn(t *testing.T) {
	t.Setenv("AGENT_ONLY_PLAIN", "plain-4c1a")
	t.Setenv("DATABASE_URL", "postgres://app:pw@db/app")
	r := newRig(t, tenantLevel(2101440, 2101449))
	r.srv.mu.Lock()
	mode := r.srv.agentInfoLocked().GetReadiness().GetAmbientEnv()
	r.srv.mu.Unlock()
	if mode != string(executor.AmbientAllowlist) {
		t.Errorf("readiness ambientEnv %q, want allowlist", mode)
	}
	res := r.runTask(taskSpec("env-1", `echo "path=$PATH"; env | grep -c -e plain-4c1a -e postgres:// || true`))
	want := "path=" + executor.DefaultTaskPath + "\n0\n"
	if res.GetReason() != "Succeeded" || res.GetStdout().GetTail() != want {
		t.Errorf("%s %s: stdout %q, want %q", res.GetReason(), res.GetMessage(), res.GetStdout().GetTail(), want)
	}
}
