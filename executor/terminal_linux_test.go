//go:build linux

package executor

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"
)

// termSession is a running task with a terminal, driven the way a person
// at a terminal would: typed input, output awaited on the stdout stream.
type termSession struct {
	t    *testing.T
	task *Task
	term *Terminal
	seen int // bytes of stdout consumed by expect
}

// startTerminal starts an interactive bash without start-up files in a
// task with a terminal of 24x80, its prompt "$ ".
func startTerminal(t *testing.T, ex *Executor) *termSession {
	t.Helper()
	// A non-interactive bash does not pass PS1 on: env does.
	spec := testSpec(t, "exec env PS1='$ ' bash --norc --noprofile -i")
	spec.Terminal = &TerminalSpec{Size: WindowSize{Rows: 24, Cols: 80}}
	spec.Timeout = 2 * time.Minute
	// A user of its own at both levels: the terminal is its.
	uid := tenantTestUIDs.Add(1)
	spec.User = &User{UID: uid, GID: uid}
	task, err := ex.Start(spec)
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	term, err := task.Terminal()
	if err != nil {
		t.Fatal(err)
	}
	s := &termSession{t: t, task: task, term: term}
	t.Cleanup(func() {
		task.Cancel()
		<-task.Done()
	})
	s.expect("$ ")
	return s
}

// typeIn writes input to the terminal.
func (s *termSession) typeIn(input string) {
	s.t.Helper()
	ctx, cancel := context.WithTimeout(s.t.Context(), 10*time.Second)
	defer cancel()
	if err := s.term.Write(ctx, []byte(input)); err != nil {
		s.t.Fatalf("typing %q: %v", input, err)
	}
}

// expect waits until want appears in the stdout stream after what the
// last expect consumed, and consumes up to its end.
func (s *termSession) expect(want string) {
	s.t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		out := s.output()
		if i := strings.Index(out[s.seen:], want); i >= 0 {
			s.seen += i + len(want)
			return
		}
		if time.Now().After(deadline) {
			s.t.Fatalf("timed out waiting for %q; the terminal showed %q", want, out[s.seen:])
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// typeUntil types input every 250 ms until the terminal shows want,
// for a key whose target takes the terminal at a moment that nothing
// shows; it fails the test after 20 s.
func (s *termSession) typeUntil(input, want string) {
	s.t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for next := time.Now(); ; time.Sleep(5 * time.Millisecond) {
		out := s.output()
		if i := strings.Index(out[s.seen:], want); i >= 0 {
			s.seen += i + len(want)
			return
		}
		if time.Now().After(deadline) {
			s.t.Fatalf("timed out typing %q for %q; the terminal showed %q", input, want, out[s.seen:])
		}
		if time.Now().After(next) {
			s.typeIn(input)
			next = time.Now().Add(250 * time.Millisecond)
		}
	}
}

// output is the stdout stream so far (the tests stay within the tail).
func (s *termSession) output() string {
	snap := s.task.Snapshot().Stdout
	if snap.Truncated {
		s.t.Fatalf("the terminal's output outgrew the tail")
	}
	return snap.Tail
}

// terminalExecutors are the levels a terminal is tested at.
func terminalExecutors(t *testing.T) map[string]*Executor {
	out := map[string]*Executor{"process": newTestExecutor(t, CgroupAuto, func(c *Config) { c.Isolation = IsolationProcess })}
	if os.Getenv(noTenantEnv) == "" {
		out["tenant"] = tenantExecutor(t)
	}
	return out
}

func forEachTerminalLevel(t *testing.T, f func(t *testing.T, ex *Executor)) {
	for level, ex := range terminalExecutors(t) {
		t.Run(level, func(t *testing.T) {
			t.Parallel()
			f(t, ex)
		})
	}
}

// The three streams are the terminal, the shell's controlling terminal,
// owned by the task's user; its type is TerminalTERM; the output is the
// stdout stream and stderr stays empty; the exit code is the shell's.
func TestTerminalIsTheTasksStreams(t *testing.T) {
	t.Parallel()
	forEachTerminalLevel(t, func(t *testing.T, ex *Executor) {
		s := startTerminal(t, ex)
		s.typeIn(`test -t 0 && test -t 1 && test -t 2 && echo "all=$((6*7))"; echo "ctty=$(ps -o tty= -p $$ | grep -c pts)" "owner=$(stat -c %u "$(tty)")" "uid=$(id -u)" "term=$TERM"; echo err >&2` + "\r")
		s.expect("all=42")
		from := s.seen
		s.expect("err\r\n")
		out := s.output()[from:s.seen]
		if !strings.Contains(out, "ctty=1 ") || !strings.Contains(out, "term="+TerminalTERM) {
			t.Errorf("want ctty=1 and term=%s in %q", TerminalTERM, out)
		}
		var owner, uid string
		_, fields, _ := strings.Cut(out, " owner=")
		if _, err := fmt.Sscanf(fields, "%s uid=%s", &owner, &uid); err != nil || owner != uid {
			t.Errorf("the terminal's owner is %q, the task's UID %q (%v) in %q", owner, uid, err, out)
		}
		s.typeIn("exit 3\r")
		res := wait(t, s.task)
		if res.ExitCode != 3 || res.Stderr.TotalBytes != 0 {
			t.Errorf("exit code %d, stderr %d bytes %q; want 3 and none", res.ExitCode, res.Stderr.TotalBytes, res.Stderr.Tail)
		}
		if !strings.Contains(res.Stdout.Tail, "err\r\n") {
			t.Errorf("stderr's line is not in the terminal's output %q", res.Stdout.Tail)
		}
		if err := s.term.Write(t.Context(), []byte("x")); !errors.Is(err, ErrTerminalClosed) {
			t.Errorf("Write after the end: %v, want ErrTerminalClosed", err)
		}
		if err := s.term.Resize(WindowSize{Rows: 1, Cols: 1}); !errors.Is(err, ErrTerminalClosed) {
			t.Errorf("Resize after the end: %v, want ErrTerminalClosed", err)
		}
	})
}

// ^C interrupts sleep and the shell lives on; ^Z stops a job, which the
// shell then resumes and ^\ quits: the line discipline signals the
// foreground process group.
func TestTerminalSignalsTheForegroundGroup(t *testing.T) {
	t.Parallel()
	forEachTerminalLevel(t, func(t *testing.T, ex *Executor) {
		s := startTerminal(t, ex)
		// The job says when it runs: bash's child takes the terminal
		// before it runs the job, so a key typed after the job's line
		// reaches it, however long the fork took.
		s.typeIn(`sh -c 'echo job=$((300+1)); exec sleep 300'` + "\r")
		s.expect("job=301")
		start := time.Now()
		s.typeIn("\x03")
		s.expect("^C")
		s.typeIn("echo status=$?\r")
		s.expect("status=130")
		if d := time.Since(start); d > 10*time.Second {
			t.Errorf("^C took %v", d)
		}
		s.typeIn(`sh -c 'echo job=$((300+2)); exec sleep 301'` + "\r")
		s.expect("job=302")
		s.typeIn("\x1a")
		s.expect("Stopped")
		s.expect("$ ") // the shell drops what was typed before its prompt
		s.typeIn("fg\r")
		s.expect("sleep 301")
		// fg prints the job before it gives the job the terminal: ^\ until
		// the job has it (the shell itself ignores SIGQUIT).
		s.typeUntil("\x1c", "Quit")
		s.typeIn("echo alive=$((2+3))\r")
		s.expect("alive=5")
	})
}

// A new window size reaches the program: tput reads it, and a program
// waiting for SIGWINCH gets it.
func TestTerminalResize(t *testing.T) {
	t.Parallel()
	forEachTerminalLevel(t, func(t *testing.T, ex *Executor) {
		s := startTerminal(t, ex)
		s.typeIn("echo cols=$(tput cols) lines=$(tput lines)\r")
		s.expect("cols=80 lines=24")
		// SIGWINCH goes to the terminal's foreground process group, so
		// the shell waits on background sleeps to stay in it; a short one
		// at a time, since a signal that comes before a wait begins does
		// not break that wait.
		s.typeIn(`trap 'echo winch=$(tput cols)x$(tput lines); w=1' WINCH; echo armed=$((1+1)); until [ -n "$w" ]; do sleep 1 & wait $!; done` + "\r")
		s.expect("armed=2") // the trap is set
		if err := s.term.Resize(WindowSize{Rows: 50, Cols: 132}); err != nil {
			t.Fatal(err)
		}
		s.expect("winch=132x50")
		s.expect("$ ") // the trap ended the loop
		s.typeIn("echo cols=$(tput cols)\r")
		s.expect("cols=132")
	})
}

// A full-screen program draws on the alternate screen and leaves it
// again; git add -p asks and takes the answer.
func TestTerminalInteractivePrograms(t *testing.T) {
	t.Parallel()
	forEachTerminalLevel(t, func(t *testing.T, ex *Executor) {
		s := startTerminal(t, ex)
		s.typeIn("cd \"$(mktemp -d)\" && echo ready=1\r")
		s.expect("ready=1")
		s.typeIn("vim -u NONE -i NONE -N -n notes.txt\r")
		s.expect("\x1b[?1049h") // the alternate screen
		s.expect("notes.txt")
		s.typeIn("ihello from vim\x1b:wq\r")
		s.expect("\x1b[?1049l") // back on the normal screen
		s.typeIn("echo file=$(cat notes.txt)\r")
		s.expect("file=hello from vim")

		s.typeIn("git init -q r && cd r && printf 'a\\n' > f && git add f && git -c user.name=t -c user.email=t@t commit -qm i && printf 'b\\n' > f && echo repo=ok\r")
		s.expect("repo=ok")
		s.typeIn("git add -p\r")
		s.expect("Stage this hunk")
		s.typeIn("y\r")
		s.typeIn("echo staged=$(git diff --cached --name-only)\r")
		s.expect("staged=f")
	})
}

// TIOCSTI, which would push input into the terminal as if typed, is
// refused at the tenant level (the seccomp filter, RefusedIoctls).
func TestTerminalRefusesTIOCSTI(t *testing.T) {
	t.Parallel()
	if os.Getenv(noTenantEnv) != "" {
		t.Skip("the tenant level is left out: this run is nested in a tenant task (" + noTenantEnv + "), and the outer run covers the filter")
	}
	s := startTerminal(t, tenantExecutor(t))
	// 0x5412 is TIOCSTI, 0x541C TIOCLINUX (asm-generic/ioctls.h).
	s.typeIn(`perl -e 'for $r (0x5412, 0x541C) { $c = "x"; printf "%x=%s\n", $r, ioctl(STDIN, $r, $c) ? "allowed" : "refused: $!" }'` + "\r")
	s.expect("5412=refused: Operation not permitted")
	s.expect("541c=refused: Operation not permitted")
}

// A terminal is the task's standard input: stdin besides it is refused
// at Start, and a task without one has no Terminal.
func TestTerminalRefusals(t *testing.T) {
	t.Parallel()
	ex := newTestExecutor(t, CgroupOff)
	for name, mutate := range map[string]func(*Spec){
		"stdin":        func(s *Spec) { s.Stdin = []byte("x") },
		"stdin stream": func(s *Spec) { s.StdinStream = &StdinStream{} },
	} {
		spec := testSpec(t, "true")
		spec.Terminal = &TerminalSpec{}
		mutate(&spec)
		_, err := ex.Start(spec)
		if !errors.Is(err, ErrInvalidSpec) || !strings.Contains(err.Error(), "terminal") {
			t.Errorf("%s: Start: %v, want ErrInvalidSpec naming the terminal", name, err)
		}
	}
	task, err := ex.Start(testSpec(t, "true"))
	if err != nil {
		t.Fatal(err)
	}
	wait(t, task)
	if _, err := task.Terminal(); !errors.Is(err, ErrNoTerminal) {
		t.Errorf("Terminal of a task without one: %v, want ErrNoTerminal", err)
	}
}
