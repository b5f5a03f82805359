//go:build linux

package executor

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/google/go-cmp/cmp"
)

// Time assertions use generous slack: they catch a missing kill (a 30 s
// sleep), not a slow machine.
const slack = 3 * time.Second

// C01: a timeout kills the whole group, whatever shape the command has.
func TestC01_TimeoutKillsGroup(t *testing.T) {
	t.Parallel()
	shapes := map[string]string{
		"plain":    "echo -n foo; sleep %s; true",
		"pipeline": "echo -n foo; sleep %s | cat; true",
		"subshell": "echo -n foo; (sleep %s); true",
	}
	forEachMechanism(t, func(t *testing.T, ex *Executor) {
		for name, shape := range shapes {
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				m := marker(30)
				spec := testSpec(t, fmt.Sprintf(shape, m))
				spec.Timeout, spec.KillGrace = time.Second, 500*time.Millisecond
				begin := time.Now()
				res := run(t, ex, spec)
				if took := time.Since(begin); took > spec.Timeout+spec.KillGrace+time.Second+slack {
					t.Errorf("took %v", took)
				}
				if res.Reason != ReasonTimedOut || res.Stdout.Tail != "foo" {
					t.Errorf("reason %s, stdout %q; want TimedOut, %q", res.Reason, res.Stdout.Tail, "foo")
				}
				if alive := withArg(m); len(alive) > 0 {
					t.Errorf("processes %v still alive", alive)
				}
			})
		}
	})
}

// C02: a background process holding stdout does not hold up the task, is
// counted and is stopped.
func TestC02_BackgroundGrandchildHoldingStdout(t *testing.T) {
	t.Parallel()
	forEachMechanism(t, func(t *testing.T, ex *Executor) {
		m := marker(30)
		spec := testSpec(t, fmt.Sprintf("sleep %s & echo started", m))
		spec.KillGrace = 2 * time.Second
		begin := time.Now()
		res := run(t, ex, spec)
		if took := time.Since(begin); took > spec.KillGrace+time.Second+slack {
			t.Errorf("took %v", took)
		}
		want := struct {
			Reason    Reason
			ExitCode  int
			Stdout    string
			Leftovers int
		}{ReasonSucceeded, 0, "started\n", 1}
		got := want
		got.Reason, got.ExitCode, got.Stdout, got.Leftovers = res.Reason, res.ExitCode, res.Stdout.Tail, res.LeftoverProcesses
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("result (-want +got):\n%s", diff)
		}
		if alive := withArg(m); len(alive) > 0 {
			t.Errorf("sleep %v still alive", alive)
		}
	})
}

// C03: a command ignoring SIGTERM is killed with SIGKILL after the grace.
func TestC03_CancelIgnoringTermEscalatesToKill(t *testing.T) {
	t.Parallel()
	forEachMechanism(t, func(t *testing.T, ex *Executor) {
		tests := map[string]struct {
			command  string
			wantTerm bool // the TERM handler prints "got-TERM"
		}{
			"ignores TERM": {"trap '' TERM; echo armed; sleep %s", false},
			// Shows the order: the handler runs on SIGTERM, and SIGKILL
			// ends the loop after the grace.
			"handles TERM": {"trap 'echo got-TERM' TERM; echo armed; while :; do sleep 0.05; done; : %s", true},
		}
		for name, tc := range tests {
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				spec := testSpec(t, fmt.Sprintf(tc.command, marker(60)))
				spec.KillGrace = time.Second
				task, err := ex.Start(spec)
				if err != nil {
					t.Fatal(err)
				}
				waitForOutput(t, task, "armed")
				cancelled := time.Now()
				task.Cancel()
				res := wait(t, task)
				took := time.Since(cancelled)
				if took < spec.KillGrace || took > spec.KillGrace+slack {
					t.Errorf("ended %v after cancel, want about the grace of %v", took, spec.KillGrace)
				}
				if res.Reason != ReasonCancelled || res.Signal != "SIGKILL" || res.ExitCode != 137 {
					t.Errorf("got %s %s %d, want Cancelled SIGKILL 137", res.Reason, res.Signal, res.ExitCode)
				}
				if got := strings.Contains(res.Stdout.Tail, "got-TERM"); got != tc.wantTerm {
					t.Errorf("stdout %q: TERM handler ran = %v, want %v", res.Stdout.Tail, got, tc.wantTerm)
				}
			})
		}
	})
}

// Exit code and signal mapping (C04 to C06) under both mechanisms.
func TestExitCodeAndSignalMapping(t *testing.T) {
	t.Parallel()
	type outcome struct {
		Reason   Reason
		ExitCode int
		Signal   string
	}
	tests := []struct {
		name    string
		command string
		timeout time.Duration
		want    outcome
	}{
		{"C04 self TERM is Signaled", "kill -TERM $$", 0, outcome{ReasonSignaled, 143, "SIGTERM"}},
		{"C04 self KILL is Signaled", "kill -KILL $$", 0, outcome{ReasonSignaled, 137, "SIGKILL"}},
		{"C05 trapped TERM exiting 0 is still TimedOut", "trap 'exit 0' TERM; sleep " + marker(60), time.Second, outcome{ReasonTimedOut, 0, ""}},
		{"C06 exit 42", "exit 42", 0, outcome{ReasonNonZeroExit, 42, ""}},
		{"exit 0", "true", 0, outcome{ReasonSucceeded, 0, ""}},
	}
	forEachMechanism(t, func(t *testing.T, ex *Executor) {
		for _, tc := range tests {
			t.Run(tc.name, func(t *testing.T) {
				t.Parallel()
				spec := testSpec(t, tc.command)
				spec.Timeout = tc.timeout
				res := run(t, ex, spec)
				if diff := cmp.Diff(tc.want, outcome{res.Reason, res.ExitCode, res.Signal}); diff != "" {
					t.Errorf("outcome (-want +got):\n%s", diff)
				}
			})
		}
	})
}

func TestC04_SelfTermIsSignaled(t *testing.T) {
	t.Parallel()
	res := run(t, newTestExecutor(t, CgroupAuto), testSpec(t, "kill -TERM $$"))
	if res.Reason != ReasonSignaled || res.ExitCode != 143 || res.Signal != "SIGTERM" {
		t.Fatalf("got %s %d %q, want Signaled 143 SIGTERM", res.Reason, res.ExitCode, res.Signal)
	}
}

func TestC05_TrappedTermExitZeroIsTimedOut(t *testing.T) {
	t.Parallel()
	spec := testSpec(t, "trap 'exit 0' TERM; sleep "+marker(60))
	spec.Timeout = time.Second
	res := run(t, newTestExecutor(t, CgroupAuto), spec)
	if res.Reason != ReasonTimedOut || res.ExitCode != 0 {
		t.Fatalf("got %s exit %d, want TimedOut exit 0", res.Reason, res.ExitCode)
	}
}

func TestC06_ExitCode(t *testing.T) {
	t.Parallel()
	res := run(t, newTestExecutor(t, CgroupAuto), testSpec(t, "exit 42"))
	if res.Reason != ReasonNonZeroExit || res.ExitCode != 42 || res.Signal != "" {
		t.Fatalf("got %s %d %q, want NonZeroExit 42 and no signal", res.Reason, res.ExitCode, res.Signal)
	}
}

// C07: every one of 50 detached sleepers dies on cancel.
func TestC07_CancelKillsFiftyDetachedSleepers(t *testing.T) {
	t.Parallel()
	forEachMechanism(t, func(t *testing.T, ex *Executor) {
		m := marker(300)
		spec := testSpec(t, fmt.Sprintf("for i in $(seq 50); do (sleep %s &) ; done; sleep %s", m, m))
		task, err := ex.Start(spec)
		if err != nil {
			t.Fatal(err)
		}
		waitFor(t, 30*time.Second, "51 sleepers", func() bool { return len(withArg(m)) == 51 })
		cancelled := time.Now()
		task.Cancel()
		res := wait(t, task)
		if took := time.Since(cancelled); took > spec.KillGrace+time.Second+slack {
			t.Errorf("took %v after cancel", took)
		}
		if res.Reason != ReasonCancelled {
			t.Errorf("reason %s, want Cancelled", res.Reason)
		}
		if alive := withArg(m); len(alive) > 0 {
			t.Errorf("%d sleepers still alive: %v", len(alive), alive)
		}
	})
}

// C08: orphans re-parented to the subreaper are reaped; not a parallel
// test so that no other test's processes come and go meanwhile.
func TestC08_NoZombiesUnderTheAgent(t *testing.T) {
	if !IsSubreaper() {
		t.Skip("needs BecomeSubreaper (running in direct-wait mode)")
	}
	ex := newTestExecutor(t, CgroupAuto)
	orphansBefore := OrphansReaped()
	for i := range 20 {
		res := run(t, ex, testSpec(t, "for i in $(seq 200); do (true &); done; wait"))
		if res.Reason != ReasonSucceeded {
			t.Fatalf("run %d: %s (%s)", i, res.Reason, res.Message)
		}
	}
	waitFor(t, 10*time.Second, "no zombie children", func() bool { return len(zombieChildren()) == 0 })
	// At the tenant level the shim, PID 1 of the task's namespace, is the
	// one that reaps them.
	if OrphansReaped() == orphansBefore && ex.Isolation() != IsolationTenant {
		t.Errorf("the reaper released no orphans: were they re-parented here at all?")
	}
}

// The reaper hands every shell its own status, also when many exit at
// once and orphans are being reaped in between.
func TestReaperDeliversEachStatusToItsTask(t *testing.T) {
	t.Parallel()
	ex := newTestExecutor(t, CgroupAuto)
	var wg sync.WaitGroup
	codes := make([]int, 40)
	for i := range codes {
		wg.Go(func() {
			spec := testSpec(t, fmt.Sprintf("(true &); exit %d", i))
			task, err := ex.Start(spec)
			if err != nil {
				t.Error(err)
				return
			}
			res := wait(t, task)
			codes[i] = res.ExitCode
		})
	}
	wg.Wait()
	for i, c := range codes {
		if c != i {
			t.Errorf("task %d got exit code %d", i, c)
		}
	}
}

// C09: a memory limit is enforced where the node delegates the memory
// controller, and reported as not enforced where it does not.
func TestC09_MemoryLimitOOM(t *testing.T) {
	t.Parallel()
	ex := newTestExecutor(t, CgroupAuto)
	limits := Limits{MemoryBytes: 64 << 20}
	if !slices.Contains(ex.Controllers(), "memory") {
		// Never run the 10 GB allocation without a limit.
		spec := testSpec(t, "true")
		spec.Limits = limits
		res := run(t, ex, spec)
		if !slices.Contains(res.LimitsNotEnforced, "memory") || !strings.Contains(res.Message, "not enforced") {
			t.Fatalf("limits not enforced = %v, message %q: want memory reported as not enforced", res.LimitsNotEnforced, res.Message)
		}
		t.Skipf("memory controller not delegated to %s (controllers %v): checked the not-enforced report, skipping the OOM run", ex.CgroupPath(), ex.Controllers())
	}
	spec := testSpec(t, `python3 -c 'a=bytearray(10**10)'`)
	spec.Limits = limits
	res := run(t, ex, spec)
	if res.Reason != ReasonOOMKilled {
		t.Fatalf("reason %s (%s), want OOMKilled", res.Reason, res.Message)
	}
}

// Without cgroups or a disk quota no limit is enforced (but pids at the
// tenant level, through RLIMIT_NPROC), and the running task says so from
// its start, as its result does at its end.
func TestLimitsWithoutCgroupAreNotEnforced(t *testing.T) {
	t.Parallel()
	spec := testSpec(t, "sleep 0.2")
	spec.Limits = Limits{MemoryBytes: 1 << 30, CPUMillis: 500, Pids: 100, DiskBytes: 1 << 30}
	ex := newTestExecutor(t, CgroupOff)
	want := []string{"cpu", "memory", "pids", LimitEphemeralStorage}
	if ex.Isolation() == IsolationTenant {
		want = []string{"cpu", "memory", LimitEphemeralStorage}
	}
	task, err := ex.Start(spec)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(want, task.LimitsNotEnforced()); diff != "" {
		t.Errorf("limits not enforced while running (-want +got):\n%s", diff)
	}
	res := wait(t, task)
	if diff := cmp.Diff(want, res.LimitsNotEnforced); diff != "" {
		t.Errorf("limits not enforced (-want +got):\n%s", diff)
	}
	if res.Mechanism != MechanismProcessGroup {
		t.Errorf("mechanism %s, want processGroup", res.Mechanism)
	}
}

// C10: cancelling a finished task changes nothing.
func TestC10_CancelAfterFinishIsIdempotent(t *testing.T) {
	t.Parallel()
	task, err := newTestExecutor(t, CgroupAuto).Start(testSpec(t, "echo done; exit 3"))
	if err != nil {
		t.Fatal(err)
	}
	before := wait(t, task)
	task.Cancel()
	task.Cancel()
	after := wait(t, task)
	if diff := cmp.Diff(before, after); diff != "" {
		t.Errorf("result changed by cancel (-before +after):\n%s", diff)
	}
	if after.Reason != ReasonNonZeroExit {
		t.Errorf("reason %s, want NonZeroExit", after.Reason)
	}
}

// stdin absent versus given (C11 to C14), in one table.
func TestStdinModes(t *testing.T) {
	t.Parallel()
	ex := newTestExecutor(t, CgroupAuto)
	tests := []struct {
		name     string
		command  string
		stdin    []byte
		want     string
		wantCode int
	}{
		{"C11 cat without stdin returns at once", "cat; echo rc=$?", nil, "rc=0\n", 0},
		{"C12 absent stdin is a character device", "test -c /dev/stdin && echo char", nil, "char\n", 0},
		{"C12 given stdin is a pipe", "test -p /dev/stdin && echo pipe", []byte("x"), "pipe\n", 0},
		{"C12 empty stdin is an empty pipe", "test -p /dev/stdin && wc -c", []byte{}, "0\n", 0},
		{"C13 exit without reading 1 MiB of stdin", "exit 7", bytes.Repeat([]byte("z"), 1<<20), "", 7},
		{"C14 wc counts stdin", "wc -c", bytes.Repeat([]byte("s"), 200000), "200000\n", 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			spec := testSpec(t, tc.command)
			spec.Stdin = tc.stdin
			spec.Timeout = 30 * time.Second // C11 must not wait for input
			res := run(t, ex, spec)
			if res.Stdout.Tail != tc.want || res.ExitCode != tc.wantCode {
				t.Errorf("stdout %q exit %d, want %q exit %d (%s)", res.Stdout.Tail, res.ExitCode, tc.want, tc.wantCode, res.Message)
			}
		})
	}
}

func TestC11_CatWithoutStdin(t *testing.T) {
	t.Parallel()
	res := run(t, newTestExecutor(t, CgroupAuto), testSpec(t, "cat; echo rc=$?"))
	if res.Stdout.Tail != "rc=0\n" {
		t.Fatalf("stdout %q", res.Stdout.Tail)
	}
}

func TestC12_StdinKind(t *testing.T) {
	t.Parallel()
	ex := newTestExecutor(t, CgroupAuto)
	if res := run(t, ex, testSpec(t, "test -c /dev/stdin && echo char")); res.Stdout.Tail != "char\n" {
		t.Errorf("absent stdin: stdout %q, want char", res.Stdout.Tail)
	}
	spec := testSpec(t, "test -p /dev/stdin && echo pipe")
	spec.Stdin = []byte("given")
	if res := run(t, ex, spec); res.Stdout.Tail != "pipe\n" {
		t.Errorf("given stdin: stdout %q, want pipe", res.Stdout.Tail)
	}
}

func TestC13_ExitWithoutReadingStdin(t *testing.T) {
	t.Parallel()
	spec := testSpec(t, "exit 7")
	spec.Stdin = bytes.Repeat([]byte("z"), 1<<20)
	res := run(t, newTestExecutor(t, CgroupAuto), spec)
	if res.Reason != ReasonNonZeroExit || res.ExitCode != 7 {
		t.Fatalf("got %s %d, want NonZeroExit 7", res.Reason, res.ExitCode)
	}
}

func TestC14_StdinBytesReachTheCommand(t *testing.T) {
	t.Parallel()
	spec := testSpec(t, "wc -c")
	spec.Stdin = bytes.Repeat([]byte("s"), 200000)
	if res := run(t, newTestExecutor(t, CgroupAuto), spec); res.Stdout.Tail != "200000\n" {
		t.Fatalf("stdout %q, want 200000", res.Stdout.Tail)
	}
}

// childEnv runs `env` with the given agent environment and returns what
// the child saw.
func childEnv(t *testing.T, ambient []string, mode AmbientMode, spec Spec) map[string]string {
	t.Helper()
	ex := newTestExecutor(t, CgroupAuto, func(c *Config) {
		c.AmbientEnviron = ambient
		c.AmbientEnv = mode
		c.AmbientAllowlist = []string{"PATH", "GH_TOKEN"}
	})
	spec.Command, spec.SpillDir, spec.KillGrace = "env", filepath.Join(t.TempDir(), "spill"), time.Second
	res := run(t, ex, spec)
	m := map[string]string{}
	for line := range strings.SplitSeq(strings.TrimSuffix(res.Stdout.Tail, "\n"), "\n") {
		if name, value, ok := strings.Cut(line, "="); ok {
			m[name] = value
		}
	}
	return m
}

var testAmbient = []string{"PATH=" + os.Getenv("PATH"), "MY_API_KEY=k", "db_password=p", "GH_TOKEN=g", "BASHTASK_STALE=s", "PLAIN=1", "BASH_ENV=/etc/hostile"}

// C15: only PLAIN of the credential-looking names reaches the child.
func TestC15_AmbientScrub(t *testing.T) {
	t.Parallel()
	env := childEnv(t, testAmbient, AmbientScrub, Spec{})
	for _, name := range []string{"MY_API_KEY", "db_password", "GH_TOKEN", "BASHTASK_STALE", "BASH_ENV"} {
		if v, ok := env[name]; ok {
			t.Errorf("%s=%s reached the child", name, v)
		}
	}
	if env["PLAIN"] != "1" {
		t.Errorf("PLAIN = %q, want 1", env["PLAIN"])
	}
}

func TestAmbientModes(t *testing.T) {
	t.Parallel()
	tests := []struct {
		mode    AmbientMode
		present []string
		absent  []string
	}{
		{AmbientAllowlist, []string{"GH_TOKEN"}, []string{"PLAIN", "MY_API_KEY"}},
		{AmbientInherit, []string{"GH_TOKEN", "PLAIN", "MY_API_KEY", "BASHTASK_STALE"}, nil},
	}
	for _, tc := range tests {
		t.Run(string(tc.mode), func(t *testing.T) {
			t.Parallel()
			env := childEnv(t, testAmbient[:len(testAmbient)-1], tc.mode, Spec{})
			for _, n := range tc.present {
				if _, ok := env[n]; !ok {
					t.Errorf("%s missing", n)
				}
			}
			for _, n := range tc.absent {
				if _, ok := env[n]; ok {
					t.Errorf("%s present", n)
				}
			}
		})
	}
}

// C16: an explicit entry wins even when it looks like a credential.
func TestC16_ExplicitCredentialNamePasses(t *testing.T) {
	t.Parallel()
	env := childEnv(t, testAmbient, AmbientScrub, Spec{Env: []EnvVar{{"GITHUB_TOKEN", "x"}}})
	if env["GITHUB_TOKEN"] != "x" {
		t.Fatalf("GITHUB_TOKEN = %q, want x", env["GITHUB_TOKEN"])
	}
}

// C17: managed facts cannot be spoofed.
func TestC17_ManagedEnvCannotBeSpoofed(t *testing.T) {
	t.Parallel()
	env := childEnv(t, testAmbient, AmbientScrub, Spec{
		Env:        []EnvVar{{"BASHTASK_NAME", "spoof"}},
		ManagedEnv: []EnvVar{{"BASHTASK_NAME", "real-task"}, {"BASHTASK_NAMESPACE", "ns"}},
	})
	if env["BASHTASK_NAME"] != "real-task" || env["BASHTASK_NAMESPACE"] != "ns" {
		t.Fatalf("BASHTASK_NAME=%q BASHTASK_NAMESPACE=%q", env["BASHTASK_NAME"], env["BASHTASK_NAMESPACE"])
	}
}

// C18: invalid entries are rejected before anything runs.
func TestC18_InvalidEnvRejectedBeforeStart(t *testing.T) {
	t.Parallel()
	ex := newTestExecutor(t, CgroupAuto)
	tests := []struct {
		name string
		env  EnvVar
		want error
	}{
		{"NUL in value", EnvVar{"A", "x\x00y"}, ErrEnvNUL},
		{"NUL in name", EnvVar{"A\x00", "x"}, ErrEnvNUL},
		{"equals in name", EnvVar{"A=B", "x"}, ErrEnvNameEquals},
		{"empty name", EnvVar{"", "x"}, ErrEnvNameEmpty},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ran := filepath.Join(t.TempDir(), "ran")
			spec := testSpec(t, "touch "+ran)
			spec.Env = []EnvVar{tc.env}
			_, err := ex.Start(spec)
			if !errors.Is(err, tc.want) {
				t.Fatalf("Start error %v, want %v", err, tc.want)
			}
			if _, err := os.Stat(ran); err == nil {
				t.Fatalf("the command ran")
			}
			if _, err := os.Stat(spec.SpillDir); err == nil {
				t.Errorf("spill directory created for a task that did not start")
			}
		})
	}
}

// C19: with neither LANG nor LC_ALL, the child gets a UTF-8 locale.
func TestC19_DefaultLocaleIsUTF8(t *testing.T) {
	t.Parallel()
	ex := newTestExecutor(t, CgroupAuto, func(c *Config) { c.AmbientEnviron = []string{"PATH=" + os.Getenv("PATH")} })
	if res := run(t, ex, testSpec(t, "locale charmap")); res.Stdout.Tail != "UTF-8\n" {
		t.Fatalf("stdout %q stderr %q, want UTF-8", res.Stdout.Tail, res.Stderr.Tail)
	}
}

// C20: fixed terminal settings.
func TestC20_TerminalSettings(t *testing.T) {
	t.Parallel()
	if res := run(t, newTestExecutor(t, CgroupAuto), testSpec(t, "echo $TERM $PAGER $NO_COLOR")); res.Stdout.Tail != "dumb cat 1\n" {
		t.Fatalf("stdout %q", res.Stdout.Tail)
	}
}

func sha(b []byte) string { s := sha256.Sum256(b); return hex.EncodeToString(s[:]) }

// C22: a stream of exactly the tail size is whole, not truncated.
func TestC22_ExactTailIsNotTruncated(t *testing.T) {
	t.Parallel()
	res := run(t, newTestExecutor(t, CgroupAuto), testSpec(t, `head -c 64000 /dev/zero | tr '\0' a`))
	want := strings.Repeat("a", 64000)
	if res.Stdout.Tail != want || res.Stdout.Truncated || res.Stdout.TotalBytes != 64000 || !res.Stdout.SpillComplete {
		t.Fatalf("tail of %d bytes, truncated %v, total %d, spill complete %v", len(res.Stdout.Tail), res.Stdout.Truncated, res.Stdout.TotalBytes, res.Stdout.SpillComplete)
	}
}

// C23: a long stream keeps its end; the spill file is the exact stream.
func TestC23_LongStreamTailAndSpill(t *testing.T) {
	t.Parallel()
	res := run(t, newTestExecutor(t, CgroupAuto), testSpec(t, "seq -f 'line-%04g' 1 20000"))
	var want bytes.Buffer
	for i := 1; i <= 20000; i++ {
		fmt.Fprintf(&want, "line-%04d\n", i)
	}
	out := res.Stdout
	if !strings.HasSuffix(out.Tail, "line-20000\n") || strings.Contains(out.Tail, "line-0001\n") || !out.Truncated {
		t.Errorf("tail end %q, truncated %v", out.Tail[max(0, len(out.Tail)-20):], out.Truncated)
	}
	// The stream is 210001 bytes: lines 1 to 9999 are 10 bytes, 10000
	// to 20000 are 11.
	if out.TotalBytes != int64(want.Len()) || out.SHA256 != sha(want.Bytes()) {
		t.Errorf("total %d sha %s, want %d %s", out.TotalBytes, out.SHA256, want.Len(), sha(want.Bytes()))
	}
	spilled, err := os.ReadFile(out.SpillPath)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(spilled, want.Bytes()) || !out.SpillComplete || out.SpillBytes != int64(want.Len()) {
		t.Errorf("spill file differs from the stream (%d bytes, complete %v)", len(spilled), out.SpillComplete)
	}
}

// C24: binary output gives a valid UTF-8 tail and an exact spill.
func TestC24_BinaryOutputIsSanitized(t *testing.T) {
	t.Parallel()
	res := run(t, newTestExecutor(t, CgroupAuto), testSpec(t, "head -c 100000 /dev/urandom"))
	out := res.Stdout
	if !utf8.ValidString(out.Tail) || !out.Sanitized || len(out.Tail) > DefaultTailBytes {
		t.Errorf("tail valid %v sanitized %v length %d", utf8.ValidString(out.Tail), out.Sanitized, len(out.Tail))
	}
	spilled, err := os.ReadFile(out.SpillPath)
	if err != nil {
		t.Fatal(err)
	}
	if len(spilled) != 100000 || sha(spilled) != out.SHA256 || out.TotalBytes != 100000 {
		t.Errorf("spill %d bytes sha %s; result total %d sha %s", len(spilled), sha(spilled), out.TotalBytes, out.SHA256)
	}
}

// C25 in small: 200 MB of output with a 1 MiB spill limit. Memory is
// checked through the tail buffer's capacity; the benchmark measures RSS
// with the full 2 GB.
func TestC25_LargeOutputBoundedMemory(t *testing.T) {
	t.Parallel()
	const total = 200_000_000
	spec := testSpec(t, fmt.Sprintf("yes | head -c %d", total))
	spec.SpillLimitBytes = 1 << 20
	task, err := newTestExecutor(t, CgroupAuto).Start(spec)
	if err != nil {
		t.Fatal(err)
	}
	res := wait(t, task)
	out := res.Stdout
	h := sha256.New()
	chunk := bytes.Repeat([]byte("y\n"), 1<<19)
	for n := 0; n < total; n += len(chunk) {
		h.Write(chunk[:min(len(chunk), total-n)])
	}
	if out.TotalBytes != total || out.SHA256 != hex.EncodeToString(h.Sum(nil)) {
		t.Errorf("total %d sha %s", out.TotalBytes, out.SHA256)
	}
	spilled, err := os.ReadFile(out.SpillPath)
	if err != nil {
		t.Fatal(err)
	}
	if out.SpillBytes != 1<<20 || out.SpillComplete || !bytes.Equal(spilled, chunk[:1<<20]) {
		t.Errorf("spill %d bytes (file %d), complete %v", out.SpillBytes, len(spilled), out.SpillComplete)
	}
	if c := task.stdout.tailCap(); c > DefaultTailBytes {
		t.Errorf("tail buffer grew to %d bytes, limit %d", c, DefaultTailBytes)
	}
	if !out.Truncated || len(out.Tail) != DefaultTailBytes {
		t.Errorf("tail %d bytes truncated %v", len(out.Tail), out.Truncated)
	}
}

// C26: stdout and stderr are kept apart.
func TestC26_StreamsKeptApart(t *testing.T) {
	t.Parallel()
	res := run(t, newTestExecutor(t, CgroupAuto), testSpec(t, "echo out; echo err >&2"))
	if res.Stdout.Tail != "out\n" || res.Stderr.Tail != "err\n" {
		t.Fatalf("stdout %q stderr %q", res.Stdout.Tail, res.Stderr.Tail)
	}
}

// C27 and the other pre-start checks: distinct errors, a message naming
// the culprit, nothing run.
func TestC27_StartFailures(t *testing.T) {
	t.Parallel()
	ex := newTestExecutor(t, CgroupAuto)
	file := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name        string
		mutate      func(*Spec)
		want        error
		wantMessage string
	}{
		{"C27 missing working directory", func(s *Spec) { s.WorkingDir = "/does/not/exist" }, ErrWorkingDirMissing, "/does/not/exist"},
		{"working directory is a file", func(s *Spec) { s.WorkingDir = file }, ErrWorkingDirNotDir, file},
		{"relative working directory", func(s *Spec) { s.WorkingDir = "rel" }, ErrInvalidSpec, "rel"},
		{"command at the kernel's per-argument limit", func(s *Spec) { s.Command = strings.Repeat("x", MaxArgStrlen) }, ErrArgumentTooLong, "131071"},
		{"command with NUL", func(s *Spec) { s.Command = "echo a\x00b" }, ErrCommandNUL, ""},
		{"env entry over the limit", func(s *Spec) { s.Env = []EnvVar{{"BIG", strings.Repeat("x", MaxArgStrlen)}} }, ErrArgumentTooLong, "BIG"},
		{"negative timeout", func(s *Spec) { s.Timeout = -time.Second }, ErrInvalidSpec, ""},
		{"tail over the maximum", func(s *Spec) { s.TailBytes = MaxTailBytes + 1 }, ErrInvalidSpec, ""},
		{"cgroup id with a slash", func(s *Spec) { s.ID = "../escape" }, ErrInvalidSpec, "escape"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			spec := testSpec(t, "true")
			tc.mutate(&spec)
			_, err := ex.Start(spec)
			var se *StartError
			if !errors.Is(err, tc.want) || !errors.As(err, &se) {
				t.Fatalf("Start error %v, want a *StartError with %v", err, tc.want)
			}
			if !strings.Contains(err.Error(), tc.wantMessage) || (errors.Is(tc.want, ErrWorkingDirMissing) && strings.Contains(err.Error(), "bash")) {
				t.Errorf("message %q should name %q and not the shell", err, tc.wantMessage)
			}
			if res := StartFailedResult(err); res.Reason != ReasonStartFailed || res.ExitCode != -1 {
				t.Errorf("StartFailedResult = %+v", res)
			}
		})
	}
	t.Run("longest command runs", func(t *testing.T) {
		t.Parallel()
		spec := testSpec(t, "true #"+strings.Repeat("x", MaxArgStrlen-1-len("true #")))
		if res := run(t, ex, spec); res.Reason != ReasonSucceeded {
			t.Fatalf("command of %d bytes: %s (%s)", len(spec.Command), res.Reason, res.Message)
		}
	})
}

func TestShellMissing(t *testing.T) {
	t.Parallel()
	if _, err := New(Config{Shell: "/does/not/exist/bash", Cgroups: CgroupOff}); !errors.Is(err, ErrShellMissing) {
		t.Fatalf("New with a missing shell: %v, want ErrShellMissing", err)
	}
	if _, err := New(Config{Shell: "bash", Cgroups: CgroupOff}); !errors.Is(err, ErrInvalidConfig) {
		t.Fatalf("New with a relative shell: %v, want ErrInvalidConfig", err)
	}
	// The shell disappears after New: Start reports it, not the kernel.
	shell := filepath.Join(t.TempDir(), "bash")
	if err := os.Symlink("/bin/bash", shell); err != nil {
		t.Fatal(err)
	}
	ex := newTestExecutor(t, CgroupOff, func(c *Config) { c.Shell = shell })
	if err := os.Remove(shell); err != nil {
		t.Fatal(err)
	}
	if _, err := ex.Start(testSpec(t, "true")); !errors.Is(err, ErrShellMissing) {
		t.Fatalf("Start with a vanished shell: %v, want ErrShellMissing", err)
	}
}
