//go:build linux

package executor

import (
	"github.com/bashtask/bashtask-operator/internal/rig/testutil"

	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/bashtask/bashtask-operator/executor/shim"
	"github.com/bashtask/bashtask-operator/internal/rig/testshim"
)

// The executor cases (C01-C27 in docs/executor.md) hold at the tenant
// level too: the test binary runs them again with every test executor at
// IsolationTenant.
func TestCasesAtTenantLevel(t *testing.T) {
	if os.Getenv(isolationEnv) != "" {
		t.Skip("this process is the rerun at a fixed level that this test starts; it does not start another")
	}
	if testing.Short() {
		t.Skip("-short: rerunning every executor case at the tenant level takes about a minute (make test runs it)")
	}
	t.Parallel()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	// The rerun is a task of this process's executor, not an os/exec
	// child: this process is a subreaper, and its reaper's wait4(-1) can
	// take a plain child's exit status before exec.Cmd.Wait does (which
	// then fails with ECHILD), while a task's status reaches its waiter.
	spec := testSpec(t, fmt.Sprintf("exec %s -test.run '^(TestC[0-2][0-9]_|TestExitCodeAndSignalMapping|TestStdinModes|TestAmbientModes)' -test.count=1 2>&1", self))
	spec.Env = []EnvVar{{isolationEnv, string(IsolationTenant)}, {noTenantEnv, "1"}, {testshim.EnvVar, testshim.Path(t)}}
	spec.TailBytes = MaxTailBytes
	spec.Timeout = 5 * time.Minute
	res := run(t, newTestExecutor(t, CgroupAuto), spec)
	if res.Reason != ReasonSucceeded || !strings.HasSuffix(res.Stdout.Tail, "PASS\n") || strings.Contains(res.Stdout.Tail, "no tests to run") {
		t.Fatalf("cases at the tenant level: %s (%s)\n%s", res.Reason, res.Message, res.Stdout.Tail)
	}
}

// A step of the shim that fails is a StartFailed naming the step, and
// nothing of the command runs; New's probe task finds it first.
func TestShimStepFailureIsStartFailed(t *testing.T) {
	t.Parallel()
	_, err := New(Config{Isolation: IsolationTenant, Cgroups: CgroupOff, Hostname: strings.Repeat("h", 65)})
	if !errors.Is(err, ErrIsolation) || !strings.Contains(err.Error(), "step hostname") {
		t.Errorf("New with a host name over the kernel's 64 bytes: %v, want ErrIsolation naming the hostname step", err)
	}
	ex := newTestExecutor(t, CgroupAuto, func(c *Config) { c.Isolation = IsolationTenant })
	ex.hostname = strings.Repeat("h", 65) // over the kernel's 64
	marker := t.TempDir() + "/ran"
	_, err = ex.Start(testSpec(t, "touch "+marker))
	var se *StartError
	if !errors.As(err, &se) || !errors.Is(err, ErrIsolation) || !strings.Contains(err.Error(), "step hostname") {
		t.Fatalf("Start: %v, want a StartError with ErrIsolation naming the hostname step", err)
	}
	if _, err := os.Stat(marker); err == nil {
		t.Errorf("the command ran")
	}
}

// What a task sees at the tenant level: its own namespaces, mounts and
// identity.
func TestTenantView(t *testing.T) {
	t.Parallel()
	secretDir := t.TempDir()
	secretFile := filepath.Join(t.TempDir(), "key.pem")
	for _, f := range []string{filepath.Join(secretDir, "journal"), secretFile} {
		if err := os.WriteFile(f, []byte("SECRET"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	ex := newTestExecutor(t, CgroupAuto, func(c *Config) {
		c.Isolation = IsolationTenant
		c.TmpSizeBytes = 8 << 20
		c.MaskPaths = []string{secretDir, secretFile, "/does/not/exist"}
	})
	spec := testSpec(t, strings.Join([]string{
		`echo masked=$(cat ` + secretDir + `/journal ` + secretFile + ` 2>&1 | grep -c SECRET)`,
		`echo uid=$(id -u) gid=$(id -g) groups=$(id -G)`,
		`echo host=$(hostname)`,
		`echo shellpid=$$ procs=$(ls -d /proc/[0-9]* | wc -l)`,
		`touch /etc/bashtask-x 2>/dev/null && echo etc=writable || echo etc=denied`,
		`echo hi > f && echo wd=$(cat f) mode=$(stat -c %a .) owner=$(stat -c %u .)`,
		`echo tmp=$(stat -f -c %T /tmp) shm=$(stat -f -c %T /dev/shm) tmpsize=$(df -B1 --output=size /tmp | tail -1 | tr -d ' ')`,
		`echo nnp=$(awk '/^NoNewPrivs/{print $2}' /proc/self/status) seccomp=$(awk '/^Seccomp:/{print $2}' /proc/self/status)`,
		`echo hidepid=$(grep -c 'hidepid=invisible' /proc/mounts)`,
		// Descriptors come and go while sleep starts (bash's child opens
		// /dev/null for a background job's stdin, the dynamic loader opens
		// the C library): a leaked one stays.
		`sleep 5 & for i in $(seq 300); do fds=$(ls /proc/$!/fd | tr '\n' ' '); [[ $fds == "0 1 2 " ]] && break; sleep 0.01; done; echo fds=$fds; kill $!`,
	}, "; "))
	spec.User = &User{UID: 2000123, GID: 2000123}
	res := run(t, ex, spec)
	if res.Reason != ReasonSucceeded {
		t.Fatalf("%s: %s\n%s", res.Reason, res.Message, res.Stderr.Tail)
	}
	for _, want := range []string{
		"uid=2000123 gid=2000123 groups=2000123\n",
		"host=bashtask\n",
		"etc=denied\n",
		"wd=hi mode=700 owner=2000123\n",
		"tmp=tmpfs shm=tmpfs tmpsize=8388608\n",
		"nnp=1 seccomp=2\n",
		"hidepid=1\n",
		"masked=0\n",
		"fds=0 1 2\n", // nothing of the shim's (its report pipe) reaches the shell
	} {
		if !strings.Contains(res.Stdout.Tail, want) {
			t.Errorf("stdout lacks %q:\n%s", want, res.Stdout.Tail)
		}
	}
	// The shim (1), the shell, and the subshell with ls: nothing of the
	// node's.
	if m := regexp.MustCompile(`procs=(\d+)`).FindStringSubmatch(res.Stdout.Tail); m == nil || m[1] > "4" || len(m[1]) > 1 {
		t.Errorf("the task sees more than its own processes:\n%s", res.Stdout.Tail)
	}
	iso := res.Isolation
	if iso.Level != IsolationTenant || iso.UID == nil || *iso.UID != 2000123 || !iso.Seccomp || iso.PidsLimit == "" {
		t.Errorf("isolation %+v", iso)
	}
}

// The task's signals to its PID 1 through kill(2) do not crash the shim,
// whichever the signal (all 64 but the three it forwards, SIGHUP, SIGINT
// and SIGTERM, and SIGKILL and SIGSTOP, which the kernel does not deliver
// to PID 1 from inside its namespace); SIGTERM to it stops the task as a
// stop from the agent does. (Signals queued with a code of the task's
// choosing are refused by the filter: the attack suite in executor/agent.)
//
// Both shims: bashtask-shim, and the agent's own binary when none lies
// beside it (here the test binary, which links cgo like a default build).
func TestTaskSignalsItsShim(t *testing.T) {
	t.Parallel()
	for name, tc := range map[string]struct {
		path string
		uid  uint32
	}{"bashtask-shim": {testshim.Path(t), 2000124}, "the test binary": {DefaultShimPath, 2000129}} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ex := newTestExecutor(t, CgroupAuto, func(c *Config) { c.Isolation = IsolationTenant; c.ShimPath = tc.path })
			spec := testSpec(t, `for s in $(seq 64); do case $s in 1|2|9|15|19) continue; esac; kill -n $s 1 || exit; done
sleep 0.2; echo alive; kill -TERM 1; sleep 5; echo not-stopped`)
			spec.User = &User{UID: tc.uid, GID: tc.uid}
			res := run(t, ex, spec)
			if res.Stdout.Tail != "alive\n" || res.Reason != ReasonSignaled || res.Signal != "SIGTERM" {
				t.Errorf("%s %s %q: want alive, then Signaled by SIGTERM", res.Reason, res.Signal, res.Stdout.Tail)
			}
		})
	}
}

// A shim that misbehaves fails the executor's start (its probe task) with
// an error naming the binary and what went wrong, within the report
// timeout, and never runs a task: one of another build (its ready report
// names another protocol, or none, as before protocols) is never given a
// Config; a silent one is killed; one that dies after the shell's start
// without reporting its exit does not pass its own status off as the
// shell's.
func TestMisbehavingShimIsRefused(t *testing.T) {
	t.Parallel()
	ready := "echo 'ready " + shim.Protocol + "' >&4"
	tests := map[string]struct {
		script  string // sh; the Config is on fd 3, reports go to fd 4
		want    []string
		noStale bool // the shim must not be given its Config
		task    bool // the shim ran the probe task: its result says what failed
	}{
		"no protocol":            {script: "echo ready >&4", want: []string{`protocol ""`, `this executor "` + shim.Protocol + `"`}, noStale: true},
		"another protocol":       {script: "echo 'ready 0' >&4", want: []string{`protocol "0"`}, noStale: true},
		"silent":                 {script: "exec sleep 60", want: []string{"did not report ready: no report within 1s"}},
		"silent after its ready": {script: ready + "; cat <&3 >/dev/null; exec sleep 60", want: []string{"no report within 1s"}},
		"dies after the start": {script: ready + "; cat <&3 >/dev/null; echo 'started 2' >&4; exit 2", task: true,
			want: []string{"probe task: NonZeroExit exit status lost: the task's shim exited with status 2 before it reported the shell's exit"}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			fake := filepath.Join(dir, "bashtask-shim")
			got := filepath.Join(dir, "config-read")
			script := "#!/bin/sh\n" + tc.script + "\n"
			if tc.noStale {
				script += "cat <&3 > " + got + "\n"
			}
			if err := os.WriteFile(fake, []byte(script), 0o755); err != nil {
				t.Fatal(err)
			}
			begin := time.Now()
			_, err := New(Config{Cgroups: CgroupAuto, CgroupParent: fmt.Sprintf("bashtask-test-%d-%d", os.Getpid(), executorSeq.Add(1)),
				WorkDirRoot: t.TempDir(), Isolation: IsolationTenant, ShimPath: fake, ShimReportTimeout: time.Second})
			took := time.Since(begin)
			if err == nil {
				t.Fatal("New succeeded")
			}
			t.Log(err)
			want := tc.want
			if !tc.task {
				want = append(want, fake)
			}
			for _, w := range want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("New: %v; want %q in the error", err, w)
				}
			}
			// The probe may start two shims (the pool's, then its own).
			if took > 10*time.Second {
				t.Errorf("New took %v with a report timeout of 1s", took)
			}
			if data, _ := os.ReadFile(got); len(data) > 0 {
				t.Errorf("the stale shim was given a Config: %q", data)
			}
		})
	}
}

// At the tenant level a working directory named in the spec is placed
// writable over the task's view, so one that would show the task the
// node's /proc, /tmp or /dev, a hidden path, the whole root or a directory
// shared by every user is refused before anything runs; an ordinary
// directory is used, symbolic links resolved.
func TestTenantWorkingDirRules(t *testing.T) {
	t.Parallel()
	const masked = "/usr/share" // hidden from this executor's tasks only
	ex := newTestExecutor(t, CgroupAuto, func(c *Config) { c.Isolation = IsolationTenant; c.MaskPaths = []string{masked} })
	shared := t.TempDir()
	if err := os.Chmod(shared, 0o1777); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(t.TempDir(), "to-proc")
	if err := os.Symlink("/proc", link); err != nil {
		t.Fatal(err)
	}
	// Under /tmp it is refused as lying there, elsewhere (a TMPDIR
	// outside /tmp) as writable by every user.
	sharedWhy := "is writable by every user"
	if strings.HasPrefix(shared, "/tmp/") {
		sharedWhy = "lies in /tmp"
	}
	for dir, why := range map[string]string{
		"/":                  "root directory",
		"/proc":              "lies in /proc",
		"/proc/1":            "lies in /proc",
		link:                 "lies in /proc",
		"/dev/shm":           "lies in /dev",
		"/tmp":               "lies in /tmp",
		filepath.Dir(masked): "holds " + masked,
		masked:               "holds " + masked,
		shared:               sharedWhy,
		"/sys/fs":            "lies in /sys",
	} {
		spec := testSpec(t, "echo ran")
		spec.WorkingDir = dir
		_, err := ex.Start(spec)
		if !errors.Is(err, ErrInvalidSpec) || !strings.Contains(err.Error(), why) {
			t.Errorf("working directory %s: %v, want ErrInvalidSpec saying %q", dir, err, why)
		}
	}
	// World-writable outside /tmp: /var/tmp where it exists as usual.
	if fi, err := os.Stat("/var/tmp"); err == nil && fi.Mode().Perm()&0o002 != 0 {
		spec := testSpec(t, "echo ran")
		spec.WorkingDir = "/var/tmp"
		if _, err := ex.Start(spec); !errors.Is(err, ErrInvalidSpec) || !strings.Contains(err.Error(), "writable by every user") {
			t.Errorf("working directory /var/tmp: %v, want ErrInvalidSpec naming the shared directory", err)
		}
	}
	spec := testSpec(t, "pwd")
	spec.WorkingDir = "/usr/bin"
	spec.User = &User{UID: 2000124, GID: 2000124}
	if res := run(t, ex, spec); res.Reason != ReasonSucceeded || res.Stdout.Tail != "/usr/bin\n" {
		t.Errorf("working directory /usr/bin: %s (%s), stdout %q", res.Reason, res.Message, res.Stdout.Tail)
	}
}

// The spec's pids limit holds at the tenant level whatever the node's
// cgroup offers: pids.max with the pids controller, RLIMIT_NPROC on the
// task's own UID without it.
func TestTenantSpecPidsLimit(t *testing.T) {
	t.Parallel()
	ex := newTestExecutor(t, CgroupAuto, func(c *Config) { c.Isolation = IsolationTenant })
	spec := testSpec(t, "ulimit -u")
	spec.User = &User{UID: 2000125, GID: 2000125}
	spec.Limits.Pids = 10
	res := run(t, ex, spec)
	if res.Reason != ReasonSucceeded {
		t.Fatalf("%s (%s)", res.Reason, res.Message)
	}
	iso := res.Isolation
	switch iso.PidsLimit {
	case PidsLimitRlimit:
		if res.Stdout.Tail != "10\n" {
			t.Errorf("ulimit -u = %q, want the spec's 10", res.Stdout.Tail)
		}
	case PidsLimitCgroup:
	default:
		t.Errorf("process limit enforced through %q, want %s or %s", iso.PidsLimit, PidsLimitCgroup, PidsLimitRlimit)
	}
	if iso.Procs != 10 || slices.Contains(res.LimitsNotEnforced, "pids") {
		t.Errorf("isolation %+v, limits not enforced %v: want 10 processes, enforced", iso, res.LimitsNotEnforced)
	}
}

// Ordinary work runs under the tenant level's allow-list filter: an
// interpreter with threads and subprocesses, git, a C compiler and the
// program it builds (glibc's fork, threads and posix_spawn try clone3
// first and fall back to clone on its ENOSYS). A tool missing on the
// machine is skipped by name.
func TestTenantRealWorkloads(t *testing.T) {
	t.Parallel()
	ex := newTestExecutor(t, CgroupAuto, func(c *Config) { c.Isolation = IsolationTenant; c.TmpSizeBytes = 64 << 20 })
	const prog = `#include <pthread.h>
#include <spawn.h>
#include <stdio.h>
#include <sys/wait.h>
#include <unistd.h>
extern char **environ;
static void *th(void *a) { return a; }
int main(void) {
	pthread_t t; void *r;
	if (pthread_create(&t, 0, th, (void *)42) || pthread_join(t, &r)) return 1;
	pid_t p = fork(); if (p == 0) _exit(7);
	int st; waitpid(p, &st, 0);
	char *argv[] = {"true", 0}; pid_t q;
	if (posix_spawn(&q, "/bin/true", 0, 0, argv, environ)) return 2;
	int st2; waitpid(q, &st2, 0);
	printf("c: thread=%ld fork=%d spawn=%d\n", (long)r, WEXITSTATUS(st), WEXITSTATUS(st2));
	return 0;
}`
	rows := []struct {
		tool, command, want string
	}{
		{"/usr/bin/python3", `/usr/bin/python3 -c '
import concurrent.futures, subprocess, tempfile, sqlite3
with concurrent.futures.ThreadPoolExecutor(4) as ex:
    s = sum(ex.map(lambda x: x * x, range(100)))
out = subprocess.run(["echo", "sub"], capture_output=True, text=True).stdout.strip()
db = sqlite3.connect(tempfile.mktemp(dir="."))
db.execute("create table t(x)")
print("python:", s, out, db.execute("select 1").fetchone()[0])
'`, "python: 328350 sub 1"},
		{"/usr/bin/git", `export HOME=$PWD GIT_AUTHOR_NAME=a GIT_AUTHOR_EMAIL=a@b GIT_COMMITTER_NAME=a GIT_COMMITTER_EMAIL=a@b
git init -q repo && cd repo && echo x > f && git add f && git commit -qm first && echo "git: $(git log --oneline | wc -l)"`, "git: 1"},
		{"/usr/bin/gcc", `cat > p.c <<'C'
` + prog + `
C
/usr/bin/gcc -pthread -o p p.c && ./p`, "c: thread=42 fork=7 spawn=0"},
	}
	for _, r := range rows {
		t.Run(filepath.Base(r.tool), func(t *testing.T) {
			t.Parallel()
			if _, err := os.Stat(r.tool); err != nil {
				t.Skipf("%s is not installed: %v", r.tool, err)
			}
			spec := testSpec(t, r.command)
			res := run(t, ex, spec)
			if res.Reason != ReasonSucceeded || !strings.Contains(res.Stdout.Tail, r.want) {
				t.Errorf("%s (%s): stdout %q, stderr %q; want %q", res.Reason, res.Message, res.Stdout.Tail, res.Stderr.Tail, r.want)
			}
		})
	}
}

// At the tenant level a task renames and links files from one directory
// to another in its working directory, /tmp and /dev/shm, as pip, setuptools
// and editors do (a temporary file moved into place): Landlock grants the
// "refer" right in the writable hierarchies from ABI 2 on. rename(2) is
// used directly: mv falls back to a copy on EXDEV and would hide a refusal.
func TestTenantRenameAcrossDirectories(t *testing.T) {
	t.Parallel()
	if abi := shim.LandlockABI(); abi < 2 {
		testutil.SkipUnlessStrictf(t, "Landlock ABI %d: before ABI 2 the kernel refuses every rename across directories under Landlock", abi)
	}
	if _, err := os.Stat("/usr/bin/python3"); err != nil {
		testutil.SkipUnlessStrictf(t, "/usr/bin/python3 is not installed: %v", err)
	}
	ex := newTestExecutor(t, CgroupAuto, func(c *Config) { c.Isolation = IsolationTenant; c.TmpSizeBytes = 64 << 20 })
	spec := testSpec(t, `for d in "$PWD" /tmp /dev/shm; do /usr/bin/python3 -c '
import os, sys
d = os.path.join(sys.argv[1], "rename-test")
os.makedirs(d + "/tmp/sub")
open(d + "/tmp/sub/f", "w").close()
os.rename(d + "/tmp/sub/f", d + "/f")
os.link(d + "/f", d + "/tmp/g")
os.rename(d + "/tmp/sub", d + "/sub")
print("renamed")
' "$d" || echo "failed in $d"; done`)
	res := run(t, ex, spec)
	if res.Reason != ReasonSucceeded || res.Stdout.Tail != "renamed\nrenamed\nrenamed\n" {
		t.Errorf("%s (%s): stdout %q, stderr %q; want three renamed", res.Reason, res.Message, res.Stdout.Tail, res.Stderr.Tail)
	}
}

// At the tenant level the task's leased UID has a name (TaskUserName), a
// group, a gecos and a HOME the task owns, in passwd and group files the
// task cannot write: whoami, id, Python's getpass (through the passwd
// entry, with LOGNAME and USER unset) and a git commit without any
// configuration work as for a user of the node.
func TestTenantUser(t *testing.T) {
	t.Parallel()
	python := "/usr/bin/python3"
	if _, err := os.Stat(python); err != nil {
		t.Skipf("%s: %v", python, err)
	}
	git, err := exec.LookPath("git")
	if err != nil {
		t.Skip("no git on this node")
	}
	ex := newTestExecutor(t, CgroupAuto, func(c *Config) { c.Isolation = IsolationTenant })
	spec := testSpec(t, strings.Join([]string{
		`echo whoami=$(whoami) id=$(id -un):$(id -gn)`,
		`echo getpass=$(env -u LOGNAME -u USER -u LNAME -u USERNAME ` + python + ` -c 'import getpass; print(getpass.getuser())')`,
		`echo env=$HOME:$USER:$LOGNAME`,
		`echo home=$(stat -c %u:%g:%a "$HOME") $(touch "$HOME/f" && echo homewrite=ok)`,
		`echo rootfiles=$(stat -c %U /)`,
		`(echo 'x:x:0:0::/:/bin/sh' >> /etc/passwd) 2>/dev/null && echo passwd=writable || echo passwd=denied`,
		`(echo 'x:x:0:' >> /etc/group) 2>/dev/null && echo group=writable || echo group=denied`,
		`echo passwdmode=$(stat -c %u:%a /etc/passwd)`,
		git + ` init -q && ` + git + ` commit -q --allow-empty -m x && ` + git + ` log -1 --format='author=%an <%ae>'`,
	}, "; "))
	spec.User = &User{UID: 2000131, GID: 2000131}
	res := run(t, ex, spec)
	if res.Reason != ReasonSucceeded {
		t.Fatalf("%s: %s\n%s\n%s", res.Reason, res.Message, res.Stdout.Tail, res.Stderr.Tail)
	}
	for _, want := range []string{
		"whoami=task id=task:task\n",
		"getpass=task\n",
		"env=/home/task:task:task\n",
		"home=2000131:2000131:700 homewrite=ok\n",
		"rootfiles=root\n",
		"passwd=denied\n",
		"group=denied\n",
		"passwdmode=0:644\n",
		"author=BashTask task <task@bashtask>\n",
	} {
		if !strings.Contains(res.Stdout.Tail, want) {
			t.Errorf("stdout lacks %q:\n%s\nstderr:\n%s", want, res.Stdout.Tail, res.Stderr.Tail)
		}
	}
	// The node's files are untouched.
	if b, err := os.ReadFile("/etc/passwd"); err != nil || strings.Contains(string(b), ":2000131:") {
		t.Errorf("the node's /etc/passwd (err %v) names the task's UID", err)
	}

	// An explicit HOME is the task's choice (docs/executor.md,
	// "Environment": the explicit entries come after the identity).
	spec = testSpec(t, `echo home=$HOME user=$USER`)
	spec.User = &User{UID: 2000132, GID: 2000132}
	spec.Env = []EnvVar{{"HOME", "/tmp"}}
	res = run(t, ex, spec)
	if want := "home=/tmp user=task\n"; res.Stdout.Tail != want {
		t.Errorf("with an explicit HOME: stdout %q, want %q (stderr %q)", res.Stdout.Tail, want, res.Stderr.Tail)
	}
}

// At the tenant level a task's environment is defined, not inherited: by
// default (no --ambient-env) no variable of the agent's reaches it, a
// credential, a path of the agent's or a harmless one alike, and PATH is
// DefaultTaskPath; a name the agent's configuration lists passes
// (docs/executor.md, "Environment").
func TestTenantEnvironmentIsDefined(t *testing.T) {
	t.Parallel()
	ambient := []string{
		"PATH=/agent/bin:" + os.Getenv("PATH"), "KUBECONFIG=/etc/agent/kubeconfig", "CONTAINER_NAME=agent", "OLDPWD=/agent",
		"AZURE_STORAGE_CONNECTION_STRING=AccountName=a;AccountKey=k", "DATABASE_URL=postgres://u:pw@db/app", "DB_PASSWD=p",
		"GITHUB_PAT=ghp", "PLAIN=1", "LANG=de_DE.UTF-8",
	}
	envOf := func(allow []string) map[string]string {
		t.Helper()
		ex := newTestExecutor(t, CgroupAuto, func(c *Config) {
			c.Isolation, c.AmbientEnviron, c.AmbientAllowlist = IsolationTenant, ambient, allow
		})
		if ex.AmbientMode() != AmbientAllowlist {
			t.Errorf("the tenant level's default ambient mode is %q, want allowlist", ex.AmbientMode())
		}
		spec := testSpec(t, "env -0")
		spec.User = &User{UID: 2000141, GID: 2000141}
		res := run(t, ex, spec)
		if res.Reason != ReasonSucceeded {
			t.Fatalf("%s: %s\n%s", res.Reason, res.Message, res.Stderr.Tail)
		}
		m := map[string]string{}
		for kv := range strings.SplitSeq(strings.TrimSuffix(res.Stdout.Tail, "\x00"), "\x00") {
			name, value, _ := strings.Cut(kv, "=")
			m[name] = value
		}
		return m
	}
	env := envOf(nil)
	for _, kv := range ambient {
		name, _, _ := strings.Cut(kv, "=")
		if name != "PATH" && name != "LANG" && env[name] != "" {
			t.Errorf("the agent's %s=%q reached the task", name, env[name])
		}
	}
	want := map[string]string{"PATH": DefaultTaskPath, "LANG": "C.UTF-8", "HOME": TaskHome, "USER": TaskUserName, "TERM": "dumb", "NO_COLOR": "1"}
	for name, value := range want {
		if env[name] != value {
			t.Errorf("%s=%q, want %q", name, env[name], value)
		}
	}
	for name := range env {
		switch {
		case slices.Contains([]string{"PATH", "LANG", "HOME", "USER", "LOGNAME", "EMAIL", "TERM", "NO_COLOR", "PAGER", "GIT_PAGER", "PWD", "SHLVL", "_"}, name),
			strings.HasPrefix(name, ManagedPrefix):
		default:
			t.Errorf("%s=%q is outside the defined environment", name, env[name])
		}
	}
	if env := envOf([]string{"PLAIN"}); env["PLAIN"] != "1" || env["KUBECONFIG"] != "" {
		t.Errorf("with PLAIN allowed: PLAIN=%q KUBECONFIG=%q, want 1 and nothing", env["PLAIN"], env["KUBECONFIG"])
	}
}

// A work root under a directory other users may not search (an agent, or
// bashtask-local, run from a checkout under a 0700 home), outside /tmp so
// that the task's private /tmp does not stand in for the fix: the task
// still reaches its working directory by its path, and sees nothing else
// of that directory.
func TestTenantWorkRootUnderPrivateDirectory(t *testing.T) {
	t.Parallel()
	base, err := os.MkdirTemp("/var/tmp", "bashtask-private-parent-")
	if err != nil {
		t.Skipf("no /var/tmp: %v", err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(base) })
	home := filepath.Join(base, "home")
	root := filepath.Join(home, "src", "checkout", ".bashtask", "work")
	if err := os.MkdirAll(root, 0o711); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(home, "secret"), []byte("s3cret\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for dir, mode := range map[string]os.FileMode{base: 0o755, home: 0o700} {
		if err := os.Chmod(dir, mode); err != nil {
			t.Fatal(err)
		}
	}
	ex := newTestExecutor(t, CgroupAuto, func(c *Config) { c.Isolation, c.WorkDirRoot = IsolationTenant, root })
	spec := testSpec(t, `echo pwd=$PWD; echo hi > "$PWD/f" && cat "$PWD/f"; cat `+filepath.Join(home, "secret")+` 2>/dev/null || echo secret=hidden; ls -A `+home)
	spec.User = &User{UID: 2000151, GID: 2000151}
	task, err := ex.Start(spec)
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	wd := task.WorkingDir()
	res := wait(t, task)
	if res.Reason != ReasonSucceeded {
		t.Fatalf("%s: %s\n%s", res.Reason, res.Message, res.Stderr.Tail)
	}
	want := "pwd=" + wd + "\nhi\nsecret=hidden\nsrc\n"
	if !strings.HasPrefix(wd, root+"/") || res.Stdout.Tail != want {
		t.Errorf("working directory %q, stdout %q, want %q\nstderr %q", wd, res.Stdout.Tail, want, res.Stderr.Tail)
	}
}
