// Package seccomp makes the system-call filter of a task at the tenant
// level (docs/security.md): its tables, and the BPF program generated from
// them for the agent's architecture. The agent assembles the program once
// ([Assemble]) and each task's shim loads it, so the shim's binary carries
// neither the tables nor the architectures' system-call lists.
package seccomp
