package shim

import (
	"bytes"
	"fmt"
	"strings"
)

// Where a workspace task's shim keeps its carry-over files, on the
// shim's private tmpfs over /home (the workspace itself is at
// /home/task): a directory owned by root, mode 0755, that the task can
// read but not change.
const (
	// WorkspaceTmpDir is the workspace's own temporary directory, at
	// the root of its file system: bound over /tmp for each of its
	// tasks (root's, mode 1777, made when missing), so that /tmp lives
	// on the workspace's storage, counts against its size and lasts
	// from one task to the next. Snapshots leave it out.
	WorkspaceTmpDir = ".bashtask-tmp"
	// CarryDir holds RCPath and CarryPath.
	CarryDir = "/home/.bashtask"
	// RCPath is the file the shell sources first (BASH_ENV): it unsets
	// BASH_ENV and sets the traps that write CarryPath.
	RCPath = CarryDir + "/rc"
	// CarryPath is the carry record the shell's traps write: owned by the
	// task's UID, mode 0600, created empty by the shim, which keeps a
	// descriptor on it and reads the record through that descriptor once
	// the shell is reaped.
	CarryPath = CarryDir + "/carry"
)

// Bounds of a carry record the shim takes.
const (
	// MaxCarryBytes is the largest record, in bytes (256 KiB): a larger
	// one is not taken.
	MaxCarryBytes = 256 << 10
	// MaxCarryEnv is the largest number of variables in a record.
	MaxCarryEnv = 1024
)

// WorkspaceConfig makes a task a workspace task ([Config.Workspace]): its
// work tree (Config.WorkTree, the workspace's root) is attached at
// Config.WorkDir below a private tmpfs over WorkDir's parent, its HOME;
// the shell starts in StartDir, resolved inside the root; and with Carry
// the shell records where it ended (and with CarryEnv what it exported)
// for the next task.
type WorkspaceConfig struct {
	// StartDir is the directory the shell starts in, relative to the
	// workspace's root ("" for the root). The shim resolves it after it
	// dropped to the task's UID, with openat2(RESOLVE_IN_ROOT) from the
	// root, so that neither ".." nor a symbolic link leaves the root.
	StartDir string `json:"startDir,omitempty"`
	// StartDirRequired makes a StartDir that does not resolve a failure
	// of the "workdir" step; without it the shell starts at the root and
	// the "workdir" report says why.
	StartDirRequired bool `json:"startDirRequired,omitempty"`
	// Carry sets BASH_ENV to RCPath, whose traps record the shell's
	// directory at its end in CarryPath; the shim reports the record
	// ("carry") before the shell's exit.
	Carry bool `json:"carry,omitempty"`
	// CarryEnv also records the variables the shell has exported.
	CarryEnv bool `json:"carryEnv,omitempty"`
}

// Carry is a workspace task shell's end state as the shim read it from
// CarryPath (the "carry" report).
type Carry struct {
	// Recorded is true when the record was complete; else Why says why
	// there is none.
	Recorded bool `json:"recorded"`
	// Dir is the physical directory the shell ended in, in the task's
	// view.
	Dir string `json:"dir,omitempty"`
	// Env are the exported variables as NAME=VALUE, in the shell's order.
	Env []string `json:"env,omitempty"`
	// Why says why nothing was recorded.
	Why string `json:"why,omitempty"`
}

// CarryNothing is Carry.Why for an empty record: the traps never ran.
const CarryNothing = "the shell recorded nothing at its end"

// carrySave is the trap body that writes the record: builtins only
// (a function or alias of the task's cannot replace them), robust to set
// -eu (the `|| builtin :` keeps a failure from changing the exit status;
// `${!n-}` reads an unset name without an error), and with >| so that
// noclobber does not refuse the file. The subshell of $(compgen -e) runs
// with a newline IFS: variable names hold no newline.
func carrySave(env bool) string {
	var b strings.Builder
	b.WriteString(`{ builtin cd -P . ; builtin printf 'dir=%s\0' "$PWD"; `)
	if env {
		b.WriteString(`IFS=$'\n'; for __bashtask_n in $(builtin compgen -e); do builtin printf 'env=%s=%s\0' "$__bashtask_n" "${!__bashtask_n-}"; done; `)
	}
	b.WriteString(`builtin printf 'end\0'; } >|` + CarryPath + ` 2>/dev/null || builtin :`)
	return b.String()
}

// CarryRC is the file bash sources from BASH_ENV before the command: it
// unsets BASH_ENV (no shell the command starts sources it again) and sets
// an EXIT trap that writes the record, and a TERM trap that writes it,
// then dies of SIGTERM as it would have without the trap (bash runs no
// EXIT trap when SIGTERM arrives while a foreground child runs, unless
// TERM is trapped; re-raising keeps the exit status 128+15).
func CarryRC(env bool) []byte {
	save := carrySave(env)
	var b bytes.Buffer
	b.WriteString("unset BASH_ENV\n")
	b.WriteString("trap -- " + quote(save) + " EXIT\n")
	b.WriteString("trap -- " + quote(save+"; trap - TERM; builtin kill -TERM $$") + " TERM\n")
	return b.Bytes()
}

// quote is s in single quotes for the shell.
func quote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

// ParseCarry reads a carry record: NUL-terminated fields "dir=<path>",
// "env=<NAME>=<VALUE>" (any number, at most MaxCarryEnv) and "end", the
// last. over says the record was longer than MaxCarryBytes. A record
// without its end, or over a bound, is not taken.
func ParseCarry(rec []byte, over bool) Carry {
	switch {
	case over:
		return Carry{Why: fmt.Sprintf("the shell's record is over %d bytes", MaxCarryBytes)}
	case len(rec) == 0:
		return Carry{Why: CarryNothing}
	}
	var c Carry
	fields := bytes.Split(rec, []byte{0})
	// A complete record ends with "end\0": the last element is empty.
	if len(fields) < 2 || string(fields[len(fields)-2]) != "end" || len(fields[len(fields)-1]) != 0 {
		return Carry{Why: "the shell's record is incomplete (it was stopped while writing it)"}
	}
	for _, f := range fields[:len(fields)-2] {
		k, v, _ := bytes.Cut(f, []byte{'='})
		switch string(k) {
		case "dir":
			c.Dir = string(v)
		case "env":
			if len(c.Env) == MaxCarryEnv {
				return Carry{Why: fmt.Sprintf("the shell exported more than %d variables", MaxCarryEnv)}
			}
			if name, _, ok := bytes.Cut(v, []byte{'='}); ok && len(name) > 0 {
				c.Env = append(c.Env, string(v))
			}
		default:
			return Carry{Why: fmt.Sprintf("the shell's record has an unknown field %q", k)}
		}
	}
	if c.Dir == "" {
		return Carry{Why: "the shell's record names no directory"}
	}
	c.Recorded = true
	return c
}
