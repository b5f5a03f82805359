package agent

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	agentv1 "github.com/bashtask/bashtask-operator/api/agent/v1"
	"github.com/bashtask/bashtask-operator/executor"
)

// workspaceRecordVersion is the version of a workspace's record format.
// A record of a newer version (an agent downgraded past a change) is left
// alone and its workspace not taken up; older versions are read and
// rewritten in this one.
const workspaceRecordVersion = 1

// Files of a workspace in its state directory, <state-dir>/workspaces/<uid>
// (root's, mode 0700, masked from every task like the rest of the state
// directory).
const (
	workspaceRecordFile = "record.json"
	workspaceImageFile  = "disk.img"
	workspaceEnvFile    = "carry-env"
)

// workspaceRecord is a workspace's durable state. It holds no carried
// values (those are in workspaceEnvFile) and nothing of a task's command.
type workspaceRecord struct {
	Version int `json:"version"`
	// Namespace, Name and UID name the BashWorkspace.
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	UID       string `json:"uid"`
	// Owner is the spec's owner, for diagnostics.
	Owner string `json:"owner,omitempty"`
	// StorageBytes is the size of the workspace's file system (the
	// agent's default filled in); 0 without one.
	StorageBytes int64 `json:"storageBytes,omitempty"`
	// StorageEnforced is true when the workspace has a file system of its
	// own (disk.img); false for a plain directory, which a restart must
	// not replace by a new, empty file system.
	StorageEnforced bool `json:"storageEnforced"`
	// Network is the executor's network of the workspace's tasks.
	Network executor.Network `json:"network"`
	// CarryWorkingDir and CarryEnv are the carry-over settings.
	CarryWorkingDir bool `json:"carryWorkingDir"`
	CarryEnv        bool `json:"carryEnv"`
	// TaskUID is the UID (and GID) leased to the workspace for its life.
	TaskUID uint32 `json:"taskUID"`
	// CreateTime is when the agent made the workspace.
	CreateTime time.Time `json:"createTime"`
	// LastTaskEnd is the end of the last task of the workspace; nil
	// before any ended.
	LastTaskEnd *time.Time `json:"lastTaskEnd,omitempty"`
	// LastTaskName and LastTaskUID name the task that ended at
	// LastTaskEnd, whose state the carried state is (or did not carry).
	LastTaskName string `json:"lastTaskName,omitempty"`
	LastTaskUID  string `json:"lastTaskUID,omitempty"`
	// CarriedDir is the directory the next task starts in, relative to
	// the workspace's root ("" for the root).
	CarriedDir string `json:"carriedDir,omitempty"`
	// CarryMessage says why the last ended task's state did not carry.
	CarryMessage string `json:"carryMessage,omitempty"`
	// CarryEnvNames lists the names of the carried variables.
	CarryEnvNames []string `json:"carryEnvNames,omitempty"`
	// Deleting is set once a deletion began: a restarted agent finishes
	// it.
	Deleting bool `json:"deleting,omitempty"`
	// Epoch is the workspace's epoch this copy was made at (the
	// controller's; 0 from an older one): tasks naming another epoch are
	// refused.
	Epoch int64 `json:"epoch,omitempty"`
	// RestoredFrom is the snapshot the copy was filled from; nil for a
	// workspace made empty.
	RestoredFrom *agentv1.WorkspaceSnapshot `json:"restoredFrom,omitempty"`
	// ForkedFrom is what the copy was forked from; nil for no fork.
	ForkedFrom *agentv1.WorkspaceFork `json:"forkedFrom,omitempty"`
	// Egress is the workspace's egress policy, applied again when a
	// restarted agent takes the workspace up; nil for none. Its
	// injection rules' values are secrets: the record is the agent's
	// (mode 0600 in a 0700 directory), never the workspace's.
	Egress *executor.EgressPolicy `json:"egress,omitempty"`
	// Pinned is set when the workspace's placement names this node
	// (WorkspaceSpec.pinned): a draining agent does not wait for it to
	// move. Absent from a record of an earlier agent: the drain waits
	// for such a workspace as for any that may move.
	Pinned bool `json:"pinned,omitempty"`
	// Image is the image the workspace's tasks run in, as its pull
	// resolved it; nil on the node's root file system.
	Image *workspaceImage `json:"image,omitempty"`
	// ImageNamed is set when the request that made the workspace named
	// its image (a reference, or the node's root): a later request that
	// names none matches only a workspace made without a name, whatever
	// the agent's --default-image is now.
	ImageNamed bool `json:"imageNamed,omitempty"`
}

// workspaceImage is a workspace's image in its record.
type workspaceImage struct {
	// Reference is the reference asked for (the request's, or the
	// agent's --default-image).
	Reference string `json:"reference"`
	// Digest is what it resolved to (an index's digest, or the
	// manifest's), ManifestDigest the store's key of the image for this
	// node's platform.
	Digest         string `json:"digest"`
	ManifestDigest string `json:"manifestDigest"`
	// RootInside runs the workspace's tasks root inside their image
	// (ImageSpec.root_inside; docs/images.md, "Root inside"): fixed when
	// the workspace is made.
	RootInside bool `json:"rootInside,omitempty"`
}

// workspaceFiles is the state directory of the workspaces:
// <state-dir>/workspaces.
type workspaceFiles struct{ dir string }

// path is the state directory of workspace uid, or one of its files.
func (f workspaceFiles) path(uid string, file ...string) string {
	return filepath.Join(append([]string{f.dir, uid}, file...)...)
}

// loadedWorkspace is one record as read at start, or why it could not be.
type loadedWorkspace struct {
	uid string
	rec *workspaceRecord
	env []executor.EnvVar
	err error
}

// load reads every workspace's record and carried variables, sorted by
// UID. A directory without a readable record is returned with its error.
func (f workspaceFiles) load() ([]loadedWorkspace, error) {
	entries, err := os.ReadDir(f.dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading the workspaces' state directory: %w", err)
	}
	var out []loadedWorkspace
	for _, e := range entries {
		if !e.IsDir() || !validUID.MatchString(e.Name()) {
			continue
		}
		lw := loadedWorkspace{uid: e.Name()}
		lw.rec, lw.err = f.readRecord(e.Name())
		if lw.err == nil && lw.rec.CarryEnv {
			lw.env, lw.err = f.readEnv(e.Name())
		}
		out = append(out, lw)
	}
	return out, nil
}

func (f workspaceFiles) readRecord(uid string) (*workspaceRecord, error) {
	b, err := os.ReadFile(f.path(uid, workspaceRecordFile))
	if err != nil {
		return nil, err
	}
	var rec workspaceRecord
	if err := json.Unmarshal(b, &rec); err != nil {
		return nil, fmt.Errorf("decoding %s: %w", workspaceRecordFile, err)
	}
	switch {
	case rec.Version > workspaceRecordVersion:
		return nil, fmt.Errorf("record version %d is newer than this agent's %d", rec.Version, workspaceRecordVersion)
	case rec.UID != uid:
		return nil, fmt.Errorf("the record names workspace %q", rec.UID)
	}
	return &rec, nil
}

// readEnv reads the carried variables: NAME=VALUE entries, each ended by
// a NUL. A missing file holds none.
func (f workspaceFiles) readEnv(uid string) ([]executor.EnvVar, error) {
	b, err := os.ReadFile(f.path(uid, workspaceEnvFile))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	return decodeEnv(b), nil
}

// create makes the workspace's state directory (0700).
func (f workspaceFiles) create(uid string) error {
	if err := os.MkdirAll(f.dir, 0o700); err != nil {
		return err
	}
	if err := os.Mkdir(f.path(uid), 0o700); err != nil && !errors.Is(err, os.ErrExist) {
		return err
	}
	return nil
}

// writeRecord replaces the record atomically (a new file renamed over the
// old one). sync makes it durable across a crash of the node, for the
// transitions a restart must not lose (creation, deletion); a carry
// update is not synced: a crash loses at most the last carried state.
func (f workspaceFiles) writeRecord(rec *workspaceRecord, sync bool) error {
	rec.Version = workspaceRecordVersion
	b, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	return writeAtomic(f.path(rec.UID), workspaceRecordFile, b, 0o600, -1, sync)
}

// writeEnv replaces the carried variables atomically: a file owned by
// owner (the workspace's UID), mode 0600, in the workspace's state
// directory, which only root may enter.
func (f workspaceFiles) writeEnv(uid string, env []executor.EnvVar, owner uint32) error {
	return writeAtomic(f.path(uid), workspaceEnvFile, encodeEnv(env), 0o600, int(owner), false)
}

// remove deletes the workspace's state directory: the agent's own files
// (the image is removed by the executor first).
func (f workspaceFiles) remove(uid string) error {
	var errs []error
	for _, name := range []string{workspaceRecordFile, workspaceEnvFile, workspaceImageFile} {
		if err := os.Remove(f.path(uid, name)); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	if err := os.Remove(f.path(uid)); err != nil && !errors.Is(err, os.ErrNotExist) {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// writeAtomic writes data to dir/name through a new file renamed into
// place, with mode perm and, when owner is not -1, that owner.
func writeAtomic(dir, name string, data []byte, perm os.FileMode, owner int, sync bool) error {
	tmp, err := os.CreateTemp(dir, "."+name+"-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name()) // a no-op once renamed
	_, err = tmp.Write(data)
	if err == nil {
		err = tmp.Chmod(perm)
	}
	if err == nil && owner >= 0 {
		err = tmp.Chown(owner, owner)
	}
	if err == nil && sync {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), filepath.Join(dir, name))
	}
	if err == nil && sync {
		if d, derr := os.Open(dir); derr == nil {
			err = unix.Fsync(int(d.Fd()))
			d.Close()
		}
	}
	if err != nil {
		return fmt.Errorf("writing %s: %w", filepath.Join(dir, name), err)
	}
	return nil
}

// neverCarried are the names a workspace never carries besides the
// managed BASHTASK_* names and what the credential scrub removes: the
// shell's own bookkeeping and the identity the agent sets for each task.
var neverCarried = []string{"PWD", "OLDPWD", "SHLVL", "_", "HOME", "USER", "LOGNAME", "BASH_ENV"}

// Why a variable did not carry over (carriedEnv): each is a group of the
// workspace's carry message.
const (
	dropCredential = "their names have the credential shapes (KEY, SECRET, TOKEN, PASSWORD, ...) the credential scrub of docs/executor.md removes"
	dropManaged    = "the prefix BASHTASK_ is the agent's own"
	dropHook       = "shell start-up hooks (BASH_ENV, ENV, SHELLOPTS, BASHOPTS, BASH_FUNC_*) never carry"
	dropName       = "not shell identifiers"
	dropTooBig     = "NAME=VALUE over the kernel's limit of %d bytes for one environment entry"
)

// droppedVar is a variable that did not carry over, and why (one of the
// drop* reasons).
type droppedVar struct{ name, why string }

// carriedEnv is env less what never carries: the names every task gets
// anew (neverCarried and fresh, the managed names the task was started
// with), which are left out silently, and, each returned in dropped with
// its reason, what executor.Scrubbed removes (names with KEY, SECRET,
// TOKEN or PASSWORD, BASHTASK_*, the shell start-up hooks;
// docs/executor.md, "Environment"), and a variable that no next task
// could be started with: a name that is not a shell identifier (bash
// exports only those, anything else came from a tampered record), or an
// entry NAME=VALUE over the kernel's limit on one environment string
// (MAX_ARG_STRLEN less the NUL, executor.MaxArgStrlen), which execve
// would refuse for every later task of the workspace. A later duplicate
// wins.
func carriedEnv(env []executor.EnvVar, fresh []string) (out []executor.EnvVar, dropped []droppedVar) {
	for _, v := range env {
		if v.Name == "" || slices.Contains(neverCarried, v.Name) || slices.Contains(fresh, v.Name) {
			continue
		}
		if why := dropReason(v); why != "" {
			if !slices.Contains(dropped, droppedVar{v.Name, why}) {
				dropped = append(dropped, droppedVar{v.Name, why})
			}
			continue
		}
		if i := slices.IndexFunc(out, func(o executor.EnvVar) bool { return o.Name == v.Name }); i >= 0 {
			out = slices.Delete(out, i, i+1)
		}
		out = append(out, v)
	}
	return out, dropped
}

// dropReason says why v does not carry over, "" when it does.
func dropReason(v executor.EnvVar) string {
	upper := strings.ToUpper(v.Name)
	switch {
	case strings.HasPrefix(upper, executor.ManagedPrefix):
		return dropManaged
	case executor.Scrubbed(v.Name) && (slices.Contains(shellHooks, v.Name) || strings.HasPrefix(v.Name, "BASH_FUNC_")):
		return dropHook
	case executor.Scrubbed(v.Name):
		return dropCredential
	case !shellName.MatchString(v.Name):
		return dropName
	case len(v.Name)+1+len(v.Value) > executor.MaxArgStrlen-1:
		return fmt.Sprintf(dropTooBig, executor.MaxArgStrlen-1)
	}
	return ""
}

// shellHooks are the shell start-up hooks the scrub removes by name
// (executor.Scrubbed), besides BASH_FUNC_*.
var shellHooks = []string{"BASH_ENV", "ENV", "SHELLOPTS", "BASHOPTS"}

// maxDroppedNames bounds the names the carry message lists per reason;
// the rest are counted.
const maxDroppedNames = 16

// droppedMessage names every variable in dropped, grouped by reason in
// the order the reasons first appear: "exported variables that did not
// carry over: KEYCLOAK_URL, MONKEY (their names have the credential
// shapes ...); ...". Empty when nothing was dropped.
func droppedMessage(dropped []droppedVar) string {
	var reasons []string
	names := map[string][]string{}
	for _, d := range dropped {
		if _, ok := names[d.why]; !ok {
			reasons = append(reasons, d.why)
		}
		names[d.why] = append(names[d.why], d.name)
	}
	parts := make([]string, 0, len(reasons))
	for _, why := range reasons {
		n := names[why]
		list := strings.Join(n[:min(len(n), maxDroppedNames)], ", ")
		if len(n) > maxDroppedNames {
			list += fmt.Sprintf(" and %d more", len(n)-maxDroppedNames)
		}
		parts = append(parts, list+" ("+why+")")
	}
	if len(parts) == 0 {
		return ""
	}
	return "exported variables that did not carry over: " + strings.Join(parts, "; ")
}

// shellName is a name bash exports: letters, digits and '_', not starting
// with a digit.
var shellName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)
