package executor

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"gocloud.dev/blob"
	"gocloud.dev/blob/fileblob"

	"github.com/bashtask/bashtask-operator/executor"
	"github.com/bashtask/bashtask-operator/hack/bench/phase"
	"github.com/bashtask/bashtask-operator/hack/bench/report"
	"github.com/bashtask/bashtask-operator/hack/bench/stats"
)

// The part-upload reader's cadence, as the agent's uploader of a running
// task's spill file: a part once 8 MiB are new, or what is new after
// partInterval.
const (
	partBytes    = 8 << 20
	partInterval = 2 * time.Second
)

// streamFigures are the 2 GB stream's figures: medians over the rounds,
// with the lowest and highest value of each.
type streamFigures struct {
	rounds           int
	plainMBs         float64
	drainMBs         float64
	hash, task, up   []float64 // MB/s per round: SHA-256 alone, the executor, the executor with part uploads
	cpuTask, cpuUp   []float64 // the child's own CPU per GB, ms
	ratioTask, ratio []float64 // per round: executor MB/s / SHA-256 MB/s of the same round, without and with uploads
	rssGrowthMB      float64   // the largest of the rounds without uploads
	last, lastUp     childReport
	loadBefore       string
	loadAfter        string
}

// measureStream measures the 2 GB stream: the plain write and the pipe
// drain once, then rounds of three variants in a random order each (a
// fixed seed): SHA-256 alone on one core, the task through the executor,
// and the task through the executor with the part-upload reader following
// its spill file. Pairing the executor's figure with the hash measured in
// the same round cancels most of the drift of a shared machine's load.
func measureStream(dir, shell string, rounds int) (streamFigures, error) {
	f := streamFigures{rounds: rounds, loadBefore: loadAvg()}
	var err error
	if f.plainMBs, err = plainWrite(dir); err != nil {
		return f, err
	}
	if f.drainMBs, err = pipeDrain(shell); err != nil {
		return f, err
	}
	order := rand.New(rand.NewPCG(3, 4))
	for range rounds {
		var hash, task, up float64
		for _, v := range order.Perm(3) {
			switch v {
			case 0:
				hash = sha256Rate()
			case 1, 2:
				cr, err := childRun(dir, shell, v == 2)
				if err != nil {
					return f, err
				}
				mbs := float64(streamBytes) / 1e6 / cr.Seconds
				cpu := cr.CPUSeconds * 1e3 / (float64(streamBytes) / 1e9)
				if v == 1 {
					task, f.last = mbs, cr
					f.cpuTask = append(f.cpuTask, cpu)
					f.rssGrowthMB = max(f.rssGrowthMB, float64(cr.HWMAfterKB-cr.HWMBeforeKB)/1024)
				} else {
					up, f.lastUp = mbs, cr
					f.cpuUp = append(f.cpuUp, cpu)
				}
			}
		}
		f.hash, f.task, f.up = append(f.hash, hash), append(f.task, task), append(f.up, up)
		f.ratioTask, f.ratio = append(f.ratioTask, task/hash), append(f.ratio, up/hash)
	}
	f.loadAfter = loadAvg()
	return f, nil
}

// print adds the stream's rows to the table.
func (f streamFigures) print(w io.Writer) {
	task, hash, up := stats.Median(f.task), stats.Median(f.hash), stats.Median(f.up)
	fmt.Fprintf(w, "2 GB stdout, MB/s (median of %d rounds)\t%.0f\t%.0f\t%.2f\t>= 0.50\t\n", f.rounds, task, f.plainMBs, task/f.plainMBs)
	fmt.Fprintf(w, "2 GB stdout against a plain pipe drain, MB/s\t%.0f\t%.0f\t%.2f\t>= 0.75\t\n", task, f.drainMBs, task/f.drainMBs)
	// Every byte is hashed in order, so no executor of this design
	// passes the hash's own speed: the ceiling of the ratio above.
	fmt.Fprintf(w, "(SHA-256 on one core, in memory, MB/s; against the drain)\t%.0f\t%.0f\t%.2f\t\t\n", hash, f.drainMBs, hash/f.drainMBs)
	fmt.Fprintf(w, "2 GB stdout against SHA-256 on one core (median of %d paired rounds; range %s)\t%.0f\t%.0f\t%.2f\t>= 0.90\t\n",
		f.rounds, spread(f.ratioTask, "%.2f"), task, hash, stats.Median(f.ratioTask))
	fmt.Fprintf(w, "2 GB stdout with part uploads against SHA-256 on one core (median of %d paired rounds; range %s)\t%.0f\t%.0f\t%.2f\t>= 0.90\t\n",
		f.rounds, spread(f.ratio, "%.2f"), up, hash, stats.Median(f.ratio))
	fmt.Fprintf(w, "CPU of the executor's process per GB of stdout, without and with part uploads, ms\t%.0f\t%.0f\t\t\t\n", stats.Median(f.cpuTask), stats.Median(f.cpuUp))
	fmt.Fprintf(w, "peak RSS growth during 2 GB, MiB\t%.1f\t\t\t< 32\t\n", f.rssGrowthMB)
}

// printNotes prints the lines under the table: the spread of each
// variant, the load, and what the last runs reported.
func (f streamFigures) printNotes() {
	fmt.Printf("2 GB stream, %d rounds, MB/s min/median/max: executor %s, with part uploads %s, SHA-256 %s; CPU ms per GB %s and %s; load average before %s, after %s\n",
		f.rounds, spread3(f.task), spread3(f.up), spread3(f.hash), spread3(f.cpuTask), spread3(f.cpuUp), f.loadBefore, f.loadAfter)
	fmt.Printf("2 GB task: %s, %d bytes, sha256 %s, peak RSS %d KiB (before %d KiB)\n",
		f.last.Reason, f.last.TotalBytes, f.last.SHA256, f.last.HWMAfterKB, f.last.HWMBeforeKB)
	fmt.Printf("2 GB task with part uploads: %s, spill file of %d bytes uploaded in %d parts, the last %.0f ms after the task's end\n",
		f.lastUp.Reason, f.lastUp.UploadedBytes, f.lastUp.Parts, f.lastUp.UploadLagSeconds*1e3)
}

// addJSON adds the stream's figures to the JSON object.
func (f streamFigures) addJSON(m phase.Figures) {
	task := stats.Median(f.task)
	m["executor.throughput_mb_s"] = round(task)
	m["executor.throughput_uploads_mb_s"] = round(stats.Median(f.up))
	m["executor.plain_write_mb_s"] = round(f.plainMBs)
	m["executor.pipe_drain_mb_s"] = round(f.drainMBs)
	m["executor.throughput_ratio"] = round(task / f.drainMBs)
	m["executor.sha256_mb_s"] = round(stats.Median(f.hash))
	m["executor.sha256_ratio"] = round(stats.Median(f.ratioTask))
	m["executor.sha256_ratio_uploads"] = round(stats.Median(f.ratio))
	m["executor.stream_cpu_ms_per_gb"] = round(stats.Median(f.cpuTask))
	m["executor.stream_cpu_ms_per_gb_uploads"] = round(stats.Median(f.cpuUp))
	m["executor.rss_growth_mb"] = round(f.rssGrowthMB)
}

// runStreamOnly measures and prints only the 2 GB stream (-starts=false).
func runStreamOnly(dir, shell string, rounds int) (phase.Figures, error) {
	if dir == "" {
		d, err := os.MkdirTemp("", "bench-executor-")
		if err != nil {
			return nil, err
		}
		defer os.RemoveAll(d)
		dir = d
	}
	f, err := measureStream(dir, shell, rounds)
	if err != nil {
		return nil, err
	}
	w := report.NewTable(os.Stdout, true)
	fmt.Fprintf(w, "measure\texecutor\tbaseline\tratio\ttarget\t\n")
	f.print(w)
	if err := w.Flush(); err != nil {
		return nil, err
	}
	f.printNotes()
	m := phase.Figures{}
	f.addJSON(m)
	return m, nil
}

// childReport is what the child process prints.
type childReport struct {
	Reason      string
	TotalBytes  int64
	SHA256      string
	Seconds     float64
	CPUSeconds  float64 // the child's own CPU (user and system) from Start to Done
	HWMBeforeKB int64
	HWMAfterKB  int64
	// With part uploads: the bytes and parts uploaded, and how long after
	// Done the last part was stored.
	UploadedBytes    int64
	Parts            int
	UploadLagSeconds float64
}

func childRun(dir, shell string, uploads bool) (childReport, error) {
	self, err := os.Executable()
	if err != nil {
		return childReport{}, err
	}
	args := []string{ChildFlag, "-dir", dir, "-shell", shell}
	if uploads {
		args = append(args, "-uploads")
	}
	out, err := exec.Command(self, args...).Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return childReport{}, fmt.Errorf("child: %w: %s", err, ee.Stderr)
		}
		return childReport{}, err
	}
	var r childReport
	if err := json.Unmarshal(out, &r); err != nil {
		return r, fmt.Errorf("child report %q: %w", out, err)
	}
	if r.TotalBytes != streamBytes {
		return r, fmt.Errorf("2 GB task: %s with %d bytes", r.Reason, r.TotalBytes)
	}
	return r, nil
}

// runChild runs the 2 GB task as the agent would (subreaper, cgroup where
// available, default tail and spill limit) and reports its figures. With
// uploads, uploadParts follows the stdout's spill file into a file://
// bucket in dir while the task runs.
func runChild(dir, shell string, uploads bool) error {
	if err := executor.BecomeSubreaper(); err != nil {
		return err
	}
	ex, err := executor.New(executor.Config{Shell: shell, CgroupParent: fmt.Sprintf("bashtask-bench-%d", os.Getpid()), WorkDirRoot: dir})
	if err != nil {
		return err
	}
	defer ex.Close()
	spill := filepath.Join(dir, fmt.Sprintf("spill-2g-%d", os.Getpid()))
	defer os.RemoveAll(spill)
	var bucket *blob.Bucket
	if uploads {
		bdir := filepath.Join(dir, fmt.Sprintf("bucket-%d", os.Getpid()))
		defer os.RemoveAll(bdir)
		if err := os.Mkdir(bdir, 0o700); err != nil {
			return err
		}
		if bucket, err = fileblob.OpenBucket(bdir, nil); err != nil {
			return err
		}
		defer bucket.Close()
	}
	before, err := vmHWM()
	if err != nil {
		return err
	}
	cpu0 := selfCPU()
	begin := time.Now()
	task, err := ex.Start(executor.Spec{
		Command:    producer(),
		WorkingDir: dir,
		SpillDir:   spill,
	})
	if err != nil {
		return err
	}
	type upResult struct {
		bytes int64
		parts int
		err   error
	}
	upDone := make(chan upResult, 1)
	if uploads {
		go func() {
			n, parts, err := uploadParts(context.Background(), task, bucket)
			upDone <- upResult{n, parts, err}
		}()
	}
	<-task.Done()
	took := time.Since(begin)
	cpu := selfCPU() - cpu0
	res, _ := task.Result()
	rep := childReport{
		Reason:     string(res.Reason),
		TotalBytes: res.Stdout.TotalBytes,
		SHA256:     res.Stdout.SHA256,
		Seconds:    took.Seconds(),
		CPUSeconds: cpu.Seconds(),
	}
	if uploads {
		u := <-upDone
		rep.UploadLagSeconds = (time.Since(begin) - took).Seconds()
		if u.err != nil {
			return u.err
		}
		if u.bytes != res.Stdout.SpillBytes {
			return fmt.Errorf("part uploads: %d bytes, the spill file has %d", u.bytes, res.Stdout.SpillBytes)
		}
		rep.UploadedBytes, rep.Parts = u.bytes, u.parts
	}
	if rep.HWMAfterKB, err = vmHWM(); err != nil {
		return err
	}
	rep.HWMBeforeKB = before
	return json.NewEncoder(os.Stdout).Encode(rep)
}

// uploadParts follows the task's stdout as the agent's reader of a
// running task's spill file does (Task.Output, waiting on its channel,
// reading the file behind the writer) and writes each new range to bucket
// as a part: 8 MiB once that many bytes are new, or what is new after
// partInterval, and the rest at the stream's end. It returns the bytes and
// parts stored. It stands for the agent's part uploader in the benchmark.
// Past the spill limit it waits for the task's end instead of waking at
// each chunk.
func uploadParts(ctx context.Context, task *executor.Task, bucket *blob.Bucket) (int64, int, error) {
	var (
		f      *os.File
		offset int64
		parts  int
		buf    = make([]byte, partBytes)
		last   = time.Now()
	)
	defer func() {
		if f != nil {
			f.Close()
		}
	}()
	timer := time.NewTimer(partInterval)
	defer timer.Stop()
	for {
		st, changed := task.Output(false)
		for st.SpillBytes-offset >= partBytes || (st.SpillBytes > offset && (st.Ended || st.SpillFailed || time.Since(last) >= partInterval)) {
			if f == nil {
				var err error
				if f, err = os.Open(st.SpillPath); err != nil {
					return offset, parts, err
				}
			}
			n := min(st.SpillBytes-offset, partBytes)
			if _, err := f.ReadAt(buf[:n], offset); err != nil {
				return offset, parts, err
			}
			if err := bucket.WriteAll(ctx, fmt.Sprintf("stdout/part-%06d", parts), buf[:n], nil); err != nil {
				return offset, parts, err
			}
			offset += n
			parts++
			last = time.Now()
		}
		if st.Ended {
			return offset, parts, nil
		}
		if offset >= st.SpillLimitBytes || st.SpillFailed {
			// Every byte the spill file will get is stored: nothing to
			// follow until the end (ReadOutput, too, stops there).
			<-task.Done()
			continue
		}
		// Reset drops a tick not taken (timers of Go 1.23 and later).
		timer.Reset(max(time.Millisecond, partInterval-time.Since(last)))
		select {
		case <-changed:
		case <-timer.C:
		}
	}
}

// selfCPU is this process's CPU time so far, user and system.
func selfCPU() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// loadAvg is the first three fields of /proc/loadavg.
func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	return strings.Join(strings.Fields(string(b))[:3], " ")
}

// spread is "min to max" of v in format.
func spread(v []float64, format string) string {
	return fmt.Sprintf(format+" to "+format, slices.Min(v), slices.Max(v))
}

// spread3 is "min/median/max" of v, rounded.
func spread3(v []float64) string {
	return fmt.Sprintf("%.0f/%.0f/%.0f", slices.Min(v), stats.Median(v), slices.Max(v))
}
