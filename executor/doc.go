// Package executor runs one shell command on a node the way docs/executor.md
// describes it: an explicitly built environment with a credential
// scrub, `<shell> -c <command>` in a new session, a cgroup v2 per task where
// the node allows one, a monotonic timeout, a TERM-grace-KILL stop of every
// process of the task, and bounded, UTF-8-safe capture of stdout and stderr
// with a spill file, a byte count and a SHA-256 over every byte.
//
// The package knows nothing about Kubernetes; the agent server builds on
// [Executor.Start] and the [Task] handle it returns.
//
// Process-wide state: a process that runs tasks should call
// [BecomeSubreaper] once before the first [Executor.Start], so that
// processes orphaned by a task are re-parented to it and reaped; from then
// on the executor's reaper owns every wait in the process (see reaper_linux.go
// for why), and the process must not start other children with os/exec.
package executor
