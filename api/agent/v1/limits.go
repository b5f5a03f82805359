// Package agentv1 is the protocol between the bashtask controller and the
// node-local agent: the Go code generated from agent.proto, and the limits
// both sides check a request against.
package agentv1

// MaxRequestBytes is the largest request message the agent's gRPC server
// accepts, 64 MiB (grpc.MaxRecvMsgSize of bashtask-agent serve). A Start
// carries the command (at most 128 KiB), stdin (at most 1 MiB from a
// Secret or ConfigMap) and up to 256 environment entries resolved from
// Secrets; gRPC's 4 MiB default would refuse specs the API accepts. The
// controller checks a Start against the limit the agent reports
// (AgentInfo.max_request_bytes) before sending it.
const MaxRequestBytes = 64 << 20

// argPointerBytes is the size of one argv or envp pointer execve copies to
// the new stack (64-bit).
const argPointerBytes = 8

// ArgEnvBytes is what execve counts against the agent's ARG_MAX
// (AgentInfo.arg_env_limit_bytes) for spec when shell runs it as
// `<shell> -c <command>`: the path, each argument and each NAME=VALUE
// string of env and managed_env with its terminating NUL, plus one pointer
// per argument and entry. A name given more than once counts once, with
// its last value, as the agent builds the environment. The agent adds its
// own part (LANG, NO_COLOR, TERM, PAGER, GIT_PAGER, BASHTASK_NAME,
// BASHTASK_NAMESPACE, BASHTASK_UID, BASHTASK_NODE and the scrubbed ambient
// environment), which this does not count unless managed_env carries it.
func ArgEnvBytes(spec *TaskSpec, shell string) int64 {
	n := int64(len(shell)+1) + int64(len(shell)+1+len("-c")+1+len(spec.GetCommand())+1) + 3*argPointerBytes
	last := map[string]int{}
	all := append(append([]*EnvVar(nil), spec.GetEnv()...), spec.GetManagedEnv()...)
	for i, e := range all {
		last[e.GetName()] = i
	}
	for i, e := range all {
		if last[e.GetName()] == i {
			n += int64(len(e.GetName())+1+len(e.GetValue())+1) + argPointerBytes
		}
	}
	return n
}

// MaxStdinWriteBytes is the most data one WriteStdinRequest carries, 4 MiB
// (api/output/v1alpha1.StdinRequestBytes, the output API's limit per request): a bulk
// copy costs few calls, and a request stays far below MaxRequestBytes.
const MaxStdinWriteBytes = 4 << 20
