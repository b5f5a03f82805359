//go:build linux

package executor

import (
	"bytes"
	"context"
	"errors"
	"strconv"
	"testing"
	"time"
)

func streamedSpec(t *testing.T, command string, idle time.Duration) Spec {
	spec := testSpec(t, command)
	spec.StdinStream = &StdinStream{IdleTimeout: idle}
	spec.Timeout = time.Minute
	spec.TailBytes = MaxTailBytes
	return spec
}

func writeStdin(t *testing.T, task *Task, offset int64, data string, closeAfter bool) StdinState {
	t.Helper()
	st, err := task.WriteStdin(t.Context(), offset, []byte(data), closeAfter)
	if err != nil {
		t.Fatalf("WriteStdin(%d, %q, close %v): %v", offset, data, closeAfter, err)
	}
	return st
}

// Bytes reach `cat` in order and exactly once: a resend of an overlapping
// range writes only its new bytes, a gap is refused, the close is EOF.
func TestStdinStreamExactlyOnce(t *testing.T) {
	t.Parallel()
	forEachMechanism(t, func(t *testing.T, ex *Executor) {
		task, err := ex.Start(streamedSpec(t, "test -p /dev/stdin && cat; echo \"[eof $?]\"", time.Minute))
		if err != nil {
			t.Fatal(err)
		}
		defer task.Cancel()
		if st := writeStdin(t, task, 0, "hello ", false); st.AcceptedBytes != 6 || st.Closed {
			t.Fatalf("after the first write: %+v", st)
		}
		waitForOutput(t, task, "hello ")
		_, err = task.WriteStdin(t.Context(), 9, []byte("xyz"), false)
		var oe *StdinOffsetError
		if !errors.As(err, &oe) || oe.Offset != 9 || oe.Accepted != 6 {
			t.Fatalf("a gap: err %v, want a StdinOffsetError naming 9 and 6", err)
		}
		// The client resends from 3 what it is unsure of, plus new bytes.
		if st := writeStdin(t, task, 3, "lo world", false); st.AcceptedBytes != 11 {
			t.Fatalf("after the overlapping resend: %+v", st)
		}
		if st := writeStdin(t, task, 0, "hello", false); st.AcceptedBytes != 11 {
			t.Fatalf("a resend of accepted bytes only: %+v", st)
		}
		if st := writeStdin(t, task, 11, "", false); st.AcceptedBytes != 11 || st.Closed {
			t.Fatalf("a query: %+v", st)
		}
		if st := writeStdin(t, task, 11, "!\n", true); st.AcceptedBytes != 13 || !st.Closed || st.Reason != StdinClosed {
			t.Fatalf("after the close: %+v", st)
		}
		// A retried close (its answer was lost) is no error; new bytes are.
		if st := writeStdin(t, task, 11, "!\n", true); st.AcceptedBytes != 13 {
			t.Fatalf("the retried close: %+v", st)
		}
		if _, err := task.WriteStdin(t.Context(), 13, []byte("late"), false); !errors.Is(err, ErrStdinClosed) {
			t.Fatalf("new bytes after the close: err %v, want ErrStdinClosed", err)
		}
		res := wait(t, task)
		if res.Stdout.Tail != "hello world!\n[eof 0]\n" || res.Reason != ReasonSucceeded {
			t.Fatalf("stdout %q (%s %s)", res.Stdout.Tail, res.Reason, res.Message)
		}
		st, ok := task.StdinState()
		if !ok || st.Reason != StdinClosed || !st.TaskEnded || st.WrittenBytes != 13 {
			t.Fatalf("final state %+v", st)
		}
	})
}

// A command that exits early (`head -c 5`) ends the input with
// ProcessExited, not an error; bytes beyond what it read are refused once
// the pipe is gone.
func TestStdinStreamCommandExitsEarly(t *testing.T) {
	t.Parallel()
	forEachMechanism(t, func(t *testing.T, ex *Executor) {
		task, err := ex.Start(streamedSpec(t, "head -c 5", time.Minute))
		if err != nil {
			t.Fatal(err)
		}
		defer task.Cancel()
		writeStdin(t, task, 0, "abcdefgh", false)
		chunk := bytes.Repeat([]byte("y"), 64<<10)
		for off := int64(8); ; {
			st, err := task.WriteStdin(t.Context(), off, chunk, false)
			if errors.Is(err, ErrStdinClosed) {
				if st.Reason != StdinProcessExited {
					t.Fatalf("closed with reason %q, want ProcessExited", st.Reason)
				}
				break
			}
			if err != nil {
				t.Fatalf("WriteStdin at %d: %v", off, err)
			}
			off = st.AcceptedBytes
		}
		res := wait(t, task)
		if res.Stdout.Tail != "abcde" || res.Reason != ReasonSucceeded {
			t.Fatalf("stdout %q (%s %s)", res.Stdout.Tail, res.Reason, res.Message)
		}
		if st, _ := task.StdinState(); !st.Closed || st.Reason != StdinProcessExited || !st.TaskEnded {
			t.Fatalf("final state %+v", st)
		}
	})
}

// A command that never reads makes writers wait once the buffer is full
// (back-pressure, nothing dropped); ending the wait returns the context's
// error with the bytes accepted, and the task's end closes the input.
func TestStdinStreamBackPressure(t *testing.T) {
	t.Parallel()
	forEachMechanism(t, func(t *testing.T, ex *Executor) {
		task, err := ex.Start(streamedSpec(t, "exec sleep "+marker(60), time.Minute))
		if err != nil {
			t.Fatal(err)
		}
		defer task.Cancel()
		total := 4 * StdinBufferBytes
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		type answer struct {
			st  StdinState
			err error
		}
		done := make(chan answer, 1)
		go func() {
			st, err := task.WriteStdin(ctx, 0, bytes.Repeat([]byte("z"), total), false)
			done <- answer{st, err}
		}()
		waitFor(t, 30*time.Second, "a full buffer", func() bool {
			st, _ := task.StdinState()
			return st.AcceptedBytes-st.WrittenBytes >= StdinBufferBytes
		})
		select {
		case a := <-done:
			t.Fatalf("the write returned while nothing reads: %+v %v", a.st, a.err)
		default:
		}
		cancel()
		a := <-done
		if !errors.Is(a.err, context.Canceled) || a.st.AcceptedBytes >= int64(total) || a.st.AcceptedBytes < StdinBufferBytes {
			t.Fatalf("the ended wait: %+v %v", a.st, a.err)
		}
		// The next write resumes at the bytes accepted.
		if _, err := task.WriteStdin(t.Context(), a.st.AcceptedBytes+1, []byte("z"), false); !errors.As(err, new(*StdinOffsetError)) {
			t.Fatalf("past the accepted bytes: %v", err)
		}
		task.Cancel()
		wait(t, task)
		if st, _ := task.StdinState(); st.Reason != StdinProcessExited || !st.TaskEnded {
			t.Fatalf("final state %+v", st)
		}
		if _, err := task.WriteStdin(t.Context(), a.st.AcceptedBytes, []byte("z"), false); !errors.Is(err, ErrStdinClosed) {
			t.Fatalf("a write after the end: %v", err)
		}
	})
}

// Without a request for the idle timeout the input closes: `cat` reads EOF
// and the task ends on its own, long before its timeout.
func TestStdinStreamIdleTimeout(t *testing.T) {
	t.Parallel()
	forEachMechanism(t, func(t *testing.T, ex *Executor) {
		task, err := ex.Start(streamedSpec(t, "cat; echo '[eof]'", 300*time.Millisecond))
		if err != nil {
			t.Fatal(err)
		}
		defer task.Cancel()
		writeStdin(t, task, 0, "early\n", false)
		res := wait(t, task)
		if res.Stdout.Tail != "early\n[eof]\n" || res.Reason != ReasonSucceeded {
			t.Fatalf("stdout %q (%s %s)", res.Stdout.Tail, res.Reason, res.Message)
		}
		if st, _ := task.StdinState(); st.Reason != StdinIdleTimeout || st.AcceptedBytes != 6 {
			t.Fatalf("final state %+v", st)
		}
	})
}

func TestStdinStreamSpecRules(t *testing.T) {
	t.Parallel()
	ex := newTestExecutor(t, CgroupOff)
	for name, spec := range map[string]Spec{
		"with stdin":   {Command: "true", Stdin: []byte("x"), StdinStream: &StdinStream{}},
		"negative":     {Command: "true", StdinStream: &StdinStream{IdleTimeout: -time.Second}},
		"over one day": {Command: "true", StdinStream: &StdinStream{IdleTimeout: MaxStdinIdleTimeout + time.Second}},
	} {
		if _, err := ex.Start(spec); !errors.Is(err, ErrInvalidSpec) {
			t.Errorf("%s: err %v, want ErrInvalidSpec", name, err)
		}
	}
	// A task without a stream refuses writes.
	task, err := ex.Start(testSpec(t, "true"))
	if err != nil {
		t.Fatal(err)
	}
	wait(t, task)
	if _, err := task.WriteStdin(t.Context(), 0, []byte("x"), false); !errors.Is(err, ErrStdinNotStreamed) {
		t.Fatalf("err %v, want ErrStdinNotStreamed", err)
	}
}

// BenchmarkStdinStream measures the throughput of a streamed stdin into
// `cat > /dev/null`, in requests of 4 MiB (the output API's largest) or
// of one 64-byte line (an interactive session): bytes per second through
// the feeder, its buffer and the pipe. Process level, no cgroup.
func BenchmarkStdinStream(b *testing.B) {
	for _, size := range []int{4 << 20, 64} {
		b.Run(strconv.Itoa(size), func(b *testing.B) {
			ex, err := New(Config{Cgroups: CgroupOff, WorkDirRoot: b.TempDir()})
			if err != nil {
				b.Fatal(err)
			}
			defer ex.Close()
			task, err := ex.Start(Spec{Command: "cat > /dev/null", SpillDir: b.TempDir() + "/spill", StdinStream: &StdinStream{IdleTimeout: time.Minute}})
			if err != nil {
				b.Fatal(err)
			}
			defer task.Cancel()
			chunk := bytes.Repeat([]byte("x"), size)
			b.SetBytes(int64(size))
			off := int64(0)
			b.ResetTimer()
			for range b.N {
				st, err := task.WriteStdin(context.Background(), off, chunk, false)
				if err != nil {
					b.Fatal(err)
				}
				off = st.AcceptedBytes
			}
			if _, err := task.WriteStdin(context.Background(), off, nil, true); err != nil {
				b.Fatal(err)
			}
			if _, err := task.Wait(context.Background()); err != nil {
				b.Fatal(err)
			}
			b.StopTimer()
		})
	}
}
