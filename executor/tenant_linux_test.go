//go:build linux

package executor

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// The executor cases (CASES.md C01-C27) hold at the tenant level too: the
// test binary runs them again with every test executor at IsolationTenant.
func TestCasesAtTenantLevel(t *testing.T) {
	if os.Getenv(isolationEnv) != "" {
		t.Skip("this process is the rerun at a fixed level that this test starts; it does not start another")
	}
	if testing.Short() {
		t.Skip("-short: rerunning every executor case at the tenant level takes about a minute (make test runs it)")
	}
	t.Parallel()
	cmd := exec.CommandContext(t.Context(), os.Args[0], "-test.run", `^(TestC[0-2][0-9]_|TestExitCodeAndSignalMapping|TestStdinModes|TestAmbientModes)`, "-test.count=1")
	cmd.Env = append(os.Environ(), isolationEnv+"="+string(IsolationTenant), noTenantEnv+"=1")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("cases at the tenant level: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), "PASS") {
		t.Fatalf("no PASS in\n%s", out)
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

// The task's signals to its PID 1 do not crash the shim; SIGTERM to it
// stops the task as a stop from the agent does.
func TestTaskSignalsItsShim(t *testing.T) {
	t.Parallel()
	ex := newTestExecutor(t, CgroupAuto, func(c *Config) { c.Isolation = IsolationTenant })
	spec := testSpec(t, `for s in QUIT ABRT USR1 SYS; do kill -$s 1; done; sleep 0.2; echo alive; kill -TERM 1; sleep 5; echo not-stopped`)
	spec.User = &User{UID: 2000124, GID: 2000124}
	res := run(t, ex, spec)
	if res.Stdout.Tail != "alive\n" || res.Reason != ReasonSignaled || res.Signal != "SIGTERM" {
		t.Errorf("%s %s %q: want alive, then Signaled by SIGTERM", res.Reason, res.Signal, res.Stdout.Tail)
	}
}
