package agent

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"regexp"

	"google.golang.org/protobuf/proto"

	agentv1 "github.com/bashtask/bashtask-operator/api/agent/v1"
)

// recordVersion is the version of the record file format.
const recordVersion = 1

// Record states. A record is written in stateStarting before the process is
// created, so an agent killed between the two still finds the task (by its
// cgroup or environment) when it comes back; it moves to stateRunning, with
// the process's identity, as soon as the executor started the shell.
const (
	stateStarting = "starting"
	stateRunning  = "running"
	stateFinished = "finished"
)

// validUID is what a task UID may look like: it becomes a directory name and
// a cgroup name, so it must be one safe path element. Kubernetes UIDs are
// RFC 4122 UUIDs, well inside this.
var validUID = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$`)

// record is a task's durable state, kept in the store's journal. It
// deliberately holds neither the command nor stdin nor the environment:
// those may carry secrets resolved by the controller, and the spec digest is
// enough to recognise a repeated Start.
type record struct {
	Version int `json:"version"`
	// State is stateStarting, stateRunning or stateFinished.
	State string `json:"state"`
	// Upload is the task's upload policy.
	Upload agentv1.UploadPolicy `json:"upload"`
	// TailBytes and SpillLimitBytes are the effective output bounds, needed
	// to rebuild the streams of a task recovered after a restart.
	TailBytes       int   `json:"tailBytes"`
	SpillLimitBytes int64 `json:"spillLimitBytes"`
	// Process identifies the task's processes for a later incarnation.
	Process processRecord `json:"process"`
	// LastTotals are the stream byte counts of the last progress event
	// (stdout, stderr): a recovered stream longer than its spill file is
	// known to be incomplete.
	LastTotals [2]int64 `json:"lastTotals"`
	// Status is the TaskStatus in protobuf binary form (base64 in the
	// JSON): the record is written at every transition, and the binary
	// form costs a fraction of protojson's encoding time.
	Status []byte `json:"status"`
}

// processRecord identifies a running task's processes.
type processRecord struct {
	// PID is the shell's process id, also its process group id (the
	// executor starts it with setsid); 0 when unknown.
	PID int `json:"pid,omitempty"`
	// StartTicks is field 22 of /proc/<pid>/stat (start time in clock
	// ticks after boot, executor.Task.ProcessStart); with the pid it tells
	// the shell from a later process that reused its id. 0 when unknown: the
	// process group is then never signalled.
	StartTicks uint64 `json:"startTicks,omitempty"`
	// Cgroup is the absolute path of the task's cgroup, empty without one.
	Cgroup string `json:"cgroup,omitempty"`
	// WorkDir is the fresh working directory the executor created for the
	// task (the spec named none); a later incarnation removes it. Empty when
	// the spec named a directory, which is never removed.
	WorkDir string `json:"workDir,omitempty"`
	// BootID is /proc/sys/kernel/random/boot_id at start: after a reboot
	// no process of the task can be left.
	BootID string `json:"bootID,omitempty"`
	// TaskUID is the UID (and GID) leased to the task at the tenant
	// level; nil when it ran as the configured or the agent's own user.
	TaskUID *uint32 `json:"taskUID,omitempty"`
	// LeaseReleased is set once the task's processes and its files are
	// gone, so TaskUID may be leased again; until then the lease survives
	// an agent restart.
	LeaseReleased bool `json:"leaseReleased,omitempty"`
}

// prepareStateDir creates dir and dir/tasks with mode 0700. An existing
// directory that group or others can access is narrowed to 0700 (a
// Kubernetes hostPath with DirectoryOrCreate is created 0755): records and
// output are the tasks' data, and tasks run as other users must not read
// each other's output through it.
func prepareStateDir(dir string) error {
	if !filepath.IsAbs(dir) {
		return fmt.Errorf("state directory %q is not absolute", dir)
	}
	for _, d := range []string{dir, filepath.Join(dir, "tasks")} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return fmt.Errorf("creating state directory: %w", err)
		}
		st, err := os.Stat(d)
		if err != nil {
			return fmt.Errorf("checking state directory: %w", err)
		}
		if !st.IsDir() {
			return fmt.Errorf("state directory %s is not a directory", d)
		}
		if st.Mode().Perm()&0o077 != 0 {
			if err := os.Chmod(d, 0o700); err != nil {
				return fmt.Errorf("state directory %s has mode %v and cannot be narrowed to 0700: %w", d, st.Mode().Perm(), err)
			}
		}
	}
	return nil
}

// checkWritable creates and removes a probe file in dir (readiness).
func checkWritable(dir string) error {
	f, err := os.CreateTemp(dir, ".probe-*")
	if err != nil {
		return fmt.Errorf("state directory not writable: %w", err)
	}
	name := f.Name()
	f.Close()
	if err := os.Remove(name); err != nil {
		return fmt.Errorf("state directory not writable: %w", err)
	}
	return nil
}

// specDigest is the hex SHA-256 of spec's deterministic protobuf encoding.
// It identifies a spec within one agent build; a repeated Start with a
// different digest is refused.
func specDigest(spec *agentv1.TaskSpec) (string, error) {
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(spec)
	if err != nil {
		return "", fmt.Errorf("encoding spec: %w", err)
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:]), nil
}
