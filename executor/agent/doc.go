// Package agent is the gRPC server of bashtask-agent: it serves the
// bashtask.agent.v1.Executor protocol (api/agent/v1) on top of the executor
// package.
//
// It keeps a table of tasks keyed by the BashTask's UID and a durable record
// of each under the state directory, so that an agent that was killed finds
// the tasks of its earlier incarnation when it starts again, stops what is
// left of them and reports them finished with reason AgentRestarted, with
// the output captured so far (docs/agent.md, "Restarts"). It sends throttled
// progress and complete terminal events on Watch, uploads spill files to a
// gocloud.dev/blob bucket with capped exponential backoff without holding
// back the terminal event, and deletes a task's local files on Forget only
// after its uploads are done.
//
// State directory layout (every directory 0700, every file 0600):
//
//	<state-dir>/records.journal     the durable records (no command, stdin or env)
//	<state-dir>/tasks/<uid>/stdout  the spill files written by the executor, each
//	<state-dir>/tasks/<uid>/stderr  made (with the directory) by its first byte
//	<state-dir>/uploads/            the default file:// bucket
package agent
