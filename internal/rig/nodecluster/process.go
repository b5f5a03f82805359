//go:build linux

package nodecluster

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/bashtask/bashtask-operator/internal/procfs"
)

// A component is one long-running process of the cluster. It is started in
// a session of its own and not supervised: the cluster outlives `up`, and
// `down` (maybe from another process) finds it again through its record,
// pids/<name>, which holds the pid and the start time, so a pid that was
// reused by an unrelated process is never signalled.
type component struct {
	name string
	bin  string
	args []string
}

// record is what pids/<name> holds.
type record struct {
	pid        int
	startTicks uint64
}

func (c *Cluster) pidFile(name string) string { return filepath.Join(c.opts.Dir, "pids", name) }

// LogFile is the path of a component's log: logs/<name>.log in the
// cluster directory.
func (c *Cluster) LogFile(name string) string {
	return filepath.Join(c.opts.Dir, "logs", name+".log")
}

// start runs p with its output in its log file and records it.
func (c *Cluster) start(p component) error {
	for _, d := range []string{filepath.Dir(c.pidFile(p.name)), filepath.Dir(c.LogFile(p.name))} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return err
		}
	}
	logf, err := os.OpenFile(c.LogFile(p.name), os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o644)
	if err != nil {
		return err
	}
	defer logf.Close()
	cmd := exec.Command(p.bin, p.args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.Dir = c.opts.Dir
	cmd.Env = c.componentEnv()
	// A session of its own: the component outlives this process and a
	// terminal's Ctrl-C does not reach it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	fmt.Fprintf(c.opts.Log, "cluster: starting %s (log %s)\n", p.name, c.LogFile(p.name))
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("starting %s: %w", p.name, err)
	}
	pid := cmd.Process.Pid
	st, err := procfs.ReadStat(pid)
	if err != nil {
		_ = cmd.Process.Kill()
		return fmt.Errorf("reading the start time of %s (pid %d): %w", p.name, pid, err)
	}
	// Reap it when it ends while this process lives, so a dead component
	// is not a zombie that still answers kill(pid, 0).
	go func() { _ = cmd.Wait() }()
	line := fmt.Sprintf("%d %d\n", pid, st.StartTicks)
	return os.WriteFile(c.pidFile(p.name), []byte(line), 0o644)
}

// componentEnv is the environment of every component: this process's, with
// the directories of iptables, nft, conntrack and runc (Debian puts them in
// sbin) on PATH.
func (c *Cluster) componentEnv() []string {
	env := os.Environ()
	path := "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
	for i, kv := range env {
		if strings.HasPrefix(kv, "PATH=") {
			env[i] = "PATH=" + path + ":" + strings.TrimPrefix(kv, "PATH=")
			return env
		}
	}
	return append(env, "PATH="+path)
}

// readRecord reads pids/<name>; ok is false when there is none or the
// process it names is gone (or is another process with the same pid).
func (c *Cluster) readRecord(name string) (r record, ok bool) {
	b, err := os.ReadFile(c.pidFile(name))
	if err != nil {
		return record{}, false
	}
	f := strings.Fields(string(b))
	if len(f) != 2 {
		return record{}, false
	}
	r.pid, _ = strconv.Atoi(f[0])
	r.startTicks, _ = strconv.ParseUint(f[1], 10, 64)
	return r, r.pid > 0 && alive(r)
}

// alive reports whether r's process still runs: same start time, not a
// zombie.
func alive(r record) bool {
	st, err := procfs.ReadStat(r.pid)
	return err == nil && st.StartTicks == r.startTicks && st.State != 'Z'
}

// running reports whether the component's recorded process is alive.
func (c *Cluster) running(name string) bool {
	_, ok := c.readRecord(name)
	return ok
}

// stop sends SIGTERM to the component, SIGKILL after grace, waits for it to
// end and removes its record. It reports whether SIGKILL was needed.
func (c *Cluster) stop(name string, grace time.Duration) (killed bool) {
	r, ok := c.readRecord(name)
	defer os.Remove(c.pidFile(name))
	if !ok {
		return false
	}
	_ = syscall.Kill(r.pid, syscall.SIGTERM)
	deadline := time.Now().Add(grace)
	for alive(r) {
		if time.Now().After(deadline) {
			_ = syscall.Kill(r.pid, syscall.SIGKILL)
			killed = true
			for i := 0; i < 100 && alive(r); i++ {
				time.Sleep(50 * time.Millisecond)
			}
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	return killed
}

// waitFor polls check every 200 ms until it returns nil or a stopWaiting
// error, the component
// named by proc exits (its log tail is in the error), ctx ends or timeout
// passes (the last check error is in the error).
func (c *Cluster) waitFor(ctx context.Context, what, proc string, timeout time.Duration, check func(context.Context) error) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var last error
	for {
		if last = check(ctx); last == nil {
			return nil
		}
		var stop stopWaiting
		if errors.As(last, &stop) {
			return fmt.Errorf("%s: %w", what, stop.error)
		}
		if proc != "" && !c.running(proc) {
			return fmt.Errorf("%s: %s exited; the end of %s:\n%s", what, proc, c.LogFile(proc), tail(c.LogFile(proc), 30))
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s: not done after %s: %w", what, timeout, last)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// tail returns the last n lines of a file, or a note that it cannot be
// read.
func tail(path string, n int) string {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Sprintf("(cannot read %s: %v)", path, err)
	}
	defer f.Close()
	// Only the last 256 KiB matter: a long log is mostly old lines.
	if st, err := f.Stat(); err == nil && st.Size() > 256<<10 {
		_, _ = f.Seek(-256<<10, io.SeekEnd)
	}
	var lines []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		lines = append(lines, sc.Text())
		if len(lines) > n {
			lines = lines[1:]
		}
	}
	return strings.Join(lines, "\n")
}

// WriteLogTails writes the last n lines of every component's log to w,
// each under a header naming it.
func (c *Cluster) WriteLogTails(w io.Writer, n int) {
	entries, err := os.ReadDir(filepath.Join(c.opts.Dir, "logs"))
	if err != nil {
		if !errors.Is(err, fs.ErrNotExist) {
			fmt.Fprintf(w, "cluster: reading the logs: %v\n", err)
		}
		return
	}
	for _, e := range entries {
		if e.IsDir() || !strings.HasSuffix(e.Name(), ".log") {
			continue
		}
		p := filepath.Join(c.opts.Dir, "logs", e.Name())
		fmt.Fprintf(w, "----- last %d lines of %s\n%s\n", n, p, tail(p, n))
	}
}
