// Package snapshot is the snapshot phase of hack/bench (formerly
// hack/bench-snapshot). It measures a workspace snapshot against the
// command-line tools on the same data, side by side, and prints one table:
//
//   - the snapshot of a tree of about 1 GiB of mixed files
//     (executor/snapshot.Write to a local file) against
//     `tar -cf - . | zstd -q -o FILE` (zstd's default level 3;
//     snapshot compresses at klauspost/compress's SpeedFastest, about
//     zstd's level 1, on every core);
//   - its restore into an empty directory (executor/snapshot.Read)
//     against `zstd -dc FILE | tar -xf -`, each into a new ext4 file
//     system on a loop device as a workspace's is (as root with
//     mkfs.ext4; else into a temporary directory).
//
// The tree is made once in a temporary directory (-dir to keep one):
// copies of the Go distribution's source (about 11,000 text files of
// 1 KiB to 1 MiB each, per copy), its compiled packages, log-like text,
// and incompressible random data in files of 1 MiB and one of 200 MiB.
// Every round runs the four operations in an order that alternates, so a
// disturbance of the machine reaches both sides alike; the table shows
// the medians of -rounds rounds in MB/s of the tree's file data and the
// ratios (the target: at least 0.80 both ways, docs/performance.md).
// Every operation starts with the page cache holding the source; the
// output files and directories are removed between rounds. The figures
// are the phase's JSON section. The table
// also gives the largest Go heap in use (runtime.MemStats.HeapInuse,
// sampled every 5 ms, above what it was before) during a snapshot and a
// restore, the largest over the rounds. With
// -cpuprofile PREFIX the last round's snapshot and restore write CPU
// profiles to PREFIX.write and PREFIX.read (go tool pprof reads them).
package snapshot

import (
	"context"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"slices"
	"strings"
	"time"

	"github.com/bashtask/bashtask-operator/executor/snapshot"
	"github.com/bashtask/bashtask-operator/hack/bench/phase"
	"github.com/bashtask/bashtask-operator/hack/bench/report"
	"github.com/bashtask/bashtask-operator/hack/bench/stats"
)

// Phase is the snapshot phase.
type Phase struct {
	dir            string
	rounds, copies int
}

// Name is "snapshot".
func (*Phase) Name() string { return "snapshot" }

// Flags registers the flags of the former hack/bench-snapshot.
func (p *Phase) Flags(fs *flag.FlagSet) {
	fs.StringVar(&p.dir, "dir", "", "the tree to measure (made there when missing); empty: a temporary one, removed at the end")
	fs.IntVar(&p.rounds, "rounds", 5, "rounds of the four operations")
	fs.IntVar(&p.copies, "copies", 4, "copies of the Go source in the tree")
	fs.StringVar(&cpuProfile, "cpuprofile", "", "write CPU profiles of the last round's snapshot and restore to this prefix + .write and .read")
}

// Run measures and prints the snapshot's table.
func (p *Phase) Run(context.Context, *phase.Env) (phase.Figures, error) {
	return run(p.dir, p.rounds, p.copies)
}

// heapPeak runs fn while sampling the heap in use every 5 ms, and returns
// the largest sample above the heap before fn, in bytes.
func heapPeak(fn func() error) (uint64, error) {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	base, peak := m.HeapInuse, m.HeapInuse
	done := make(chan struct{})
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		t := time.NewTicker(5 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				var m runtime.MemStats
				runtime.ReadMemStats(&m)
				peak = max(peak, m.HeapInuse)
			}
		}
	}()
	err := fn()
	close(done)
	<-sampled
	return peak - base, err
}

// cpuProfile is the -cpuprofile prefix; empty: no profiles.
var cpuProfile string

// profiled runs fn under a CPU profile written to cpuProfile+suffix when
// last is true and -cpuprofile is set.
func profiled(last bool, suffix string, fn func() error) error {
	if !last || cpuProfile == "" {
		return fn()
	}
	f, err := os.Create(cpuProfile + suffix)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := pprof.StartCPUProfile(f); err != nil {
		return err
	}
	defer pprof.StopCPUProfile()
	return fn()
}

func run(dir string, rounds, copies int) (phase.Figures, error) {
	for _, tool := range []string{"tar", "zstd"} {
		if _, err := exec.LookPath(tool); err != nil {
			return nil, fmt.Errorf("%s is needed for the reference (apt-get install %s)", tool, tool)
		}
	}
	work, err := os.MkdirTemp("", "bench-snapshot-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(work)
	if dir == "" {
		dir = filepath.Join(work, "tree")
	}
	if _, err := os.Stat(dir); os.IsNotExist(err) {
		fmt.Printf("making the tree in %s ...\n", dir)
		if err := makeTree(dir, copies); err != nil {
			return nil, err
		}
	}
	data, files, err := treeSize(dir)
	if err != nil {
		return nil, err
	}
	fmt.Printf("tree: %d files, %.0f MiB of data, GOMAXPROCS %d\n", files, float64(data)/(1<<20), runtime.GOMAXPROCS(0))

	ours, theirs := filepath.Join(work, "snap.tar.zst"), filepath.Join(work, "ref.tar.zst")
	var snapT, tarT, restT, untarT []float64
	var archBytes, refBytes int64
	var writeHeap, readHeap uint64
	uid, gid := uint32(os.Geteuid()), uint32(os.Getegid())
	for r := range rounds {
		if err := warm(dir); err != nil {
			return nil, err
		}
		snapshotOp := func() error {
			var d float64
			peak, err := heapPeak(func() (err error) {
				d, err = timed(func() error {
					return profiled(r == rounds-1, ".write", func() error {
						n, err := writeSnapshot(dir, ours, uid)
						archBytes = n
						return err
					})
				})
				return err
			})
			writeHeap = max(writeHeap, peak)
			snapT = append(snapT, d)
			return err
		}
		tarOp := func() error {
			d, err := timed(func() error {
				return sh(fmt.Sprintf("tar -C %q -cf - . | zstd -q -f -o %q", dir, theirs))
			})
			tarT = append(tarT, d)
			return err
		}
		ops := []func() error{snapshotOp, tarOp}
		if r%2 == 1 {
			slices.Reverse(ops)
		}
		for _, op := range ops {
			if err := op(); err != nil {
				return nil, err
			}
		}
		if fi, err := os.Stat(theirs); err == nil {
			refBytes = fi.Size()
		}
		restoreOp := func() error {
			out, cleanup, err := freshDir(work, "restored", data)
			if err != nil {
				return err
			}
			defer cleanup()
			var d float64
			peak, err := heapPeak(func() (err error) {
				d, err = timed(func() error {
					return profiled(r == rounds-1, ".read", func() error { return readSnapshot(ours, out, uid, gid) })
				})
				return err
			})
			readHeap = max(readHeap, peak)
			restT = append(restT, d)
			return err
		}
		untarOp := func() error {
			out, cleanup, err := freshDir(work, "untarred", data)
			if err != nil {
				return err
			}
			defer cleanup()
			d, err := timed(func() error { return sh(fmt.Sprintf("zstd -q -dc %q | tar -C %q -xf -", theirs, out)) })
			untarT = append(untarT, d)
			return err
		}
		ops = []func() error{restoreOp, untarOp}
		if r%2 == 1 {
			slices.Reverse(ops)
		}
		for _, op := range ops {
			if err := warmFile(ours, theirs); err != nil {
				return nil, err
			}
			if err := op(); err != nil {
				return nil, err
			}
		}
		fmt.Printf("round %d: snapshot %.2fs tar|zstd %.2fs restore %.2fs zstd -d|tar -x %.2fs (load %s)\n",
			r+1, snapT[r], tarT[r], restT[r], untarT[r], load())
	}
	mbs := func(sec float64) float64 { return float64(data) / 1e6 / sec }
	s, t, rs, u := stats.Median(snapT), stats.Median(tarT), stats.Median(restT), stats.Median(untarT)
	w := report.NewTable(os.Stdout, false)
	fmt.Fprintf(w, "\nfigure\tours\treference\tratio\ttarget\t\n")
	fmt.Fprintf(w, "snapshot of %.0f MiB, MB/s (against tar | zstd)\t%.0f\t%.0f\t%.2f\t>= 0.80\t\n", float64(data)/(1<<20), mbs(s), mbs(t), t/s)
	fmt.Fprintf(w, "restore, MB/s (against zstd -d | tar -x)\t%.0f\t%.0f\t%.2f\t>= 0.80\t\n", mbs(rs), mbs(u), u/rs)
	fmt.Fprintf(w, "archive size, MiB\t%.1f\t%.1f\t\t\t\n", float64(archBytes)/(1<<20), float64(refBytes)/(1<<20))
	fmt.Fprintf(w, "largest heap in use, snapshot / restore, MiB\t%.0f / %.0f\t\t\t\t\n", float64(writeHeap)/(1<<20), float64(readHeap)/(1<<20))
	w.Flush()
	return phase.Figures{
		"snapshot.write_mb_s": round(mbs(s)), "snapshot.tar_zstd_mb_s": round(mbs(t)), "snapshot.write_ratio": round(t / s),
		"snapshot.read_mb_s": round(mbs(rs)), "snapshot.untar_mb_s": round(mbs(u)), "snapshot.read_ratio": round(u / rs),
		"snapshot.data_mib": round(float64(data) / (1 << 20)), "snapshot.archive_mib": round(float64(archBytes) / (1 << 20)),
		"snapshot.write_heap_mib": round(float64(writeHeap) / (1 << 20)), "snapshot.read_heap_mib": round(float64(readHeap) / (1 << 20)),
	}, nil
}

func writeSnapshot(dir, out string, uid uint32) (int64, error) {
	root, err := os.Open(dir)
	if err != nil {
		return 0, err
	}
	defer root.Close()
	f, err := os.Create(out)
	if err != nil {
		return 0, err
	}
	st, err := snapshot.Write(context.Background(), f, root, snapshot.WriteOptions{UID: uid})
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return 0, err
	}
	return st.ArchiveBytes, nil
}

func readSnapshot(archive, out string, uid, gid uint32) error {
	root, err := os.Open(out)
	if err != nil {
		return err
	}
	defer root.Close()
	f, err := os.Open(archive)
	if err != nil {
		return err
	}
	defer f.Close()
	_, err = snapshot.Read(context.Background(), f, root, snapshot.ReadOptions{UID: uid, GID: gid})
	return err
}

// freshDir returns an empty directory to restore into and its clean-up:
// as root with mkfs.ext4, a new ext4 file system on a loop device, as a
// workspace's is (creating 40,000 files in a fresh file system costs a
// fraction of doing it in a large, long-used one, so both sides get the
// same kind); otherwise a directory in work.
func freshDir(work, name string, data int64) (string, func(), error) {
	dir := filepath.Join(work, name)
	if err := os.Mkdir(dir, 0o700); err != nil {
		return "", nil, err
	}
	if _, err := exec.LookPath("mkfs.ext4"); err != nil || os.Geteuid() != 0 {
		return dir, func() { os.RemoveAll(dir) }, nil
	}
	img := dir + ".img"
	size := data*3/2 + 256<<20
	if err := sh(fmt.Sprintf("truncate -s %d %q && mkfs.ext4 -q -F %q && mount -o loop %q %q", size, img, img, img, dir)); err != nil {
		os.Remove(img)
		os.Remove(dir)
		return "", nil, fmt.Errorf("a fresh ext4 file system: %w", err)
	}
	return dir, func() {
		_ = sh(fmt.Sprintf("umount %q", dir))
		os.Remove(img)
		os.Remove(dir)
	}, nil
}

func timed(fn func() error) (float64, error) {
	start := time.Now()
	err := fn()
	return time.Since(start).Seconds(), err
}

func sh(script string) error {
	cmd := exec.Command("bash", "-o", "pipefail", "-c", script)
	cmd.Stderr = os.Stderr
	return cmd.Run()
}

// warm reads the tree so that every operation starts with it cached.
func warm(dir string) error {
	return sh(fmt.Sprintf("tar -C %q -cf - . > /dev/null", dir))
}

func warmFile(files ...string) error {
	for _, p := range files {
		f, err := os.Open(p)
		if err != nil {
			return err
		}
		_, err = io.Copy(io.Discard, f)
		f.Close()
		if err != nil {
			return err
		}
	}
	return nil
}

// makeTree writes the mixed tree.
func makeTree(dir string, copies int) error {
	out, err := exec.Command("go", "env", "GOROOT").Output()
	if err != nil {
		return fmt.Errorf("go env GOROOT, for the source to copy: %w", err)
	}
	goroot := strings.TrimSpace(string(out))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	for i := range copies {
		if err := sh(fmt.Sprintf("mkdir -p %q && cp -a %q %q", filepath.Join(dir, "src"), filepath.Join(goroot, "src"), filepath.Join(dir, "src", fmt.Sprint(i)))); err != nil {
			return err
		}
	}
	if err := sh(fmt.Sprintf("cp -a %q %q", filepath.Join(goroot, "pkg"), filepath.Join(dir, "pkg"))); err != nil {
		return err
	}
	rng := rand.New(rand.NewPCG(1, 2))
	random := func(p string, n int) error {
		b := make([]byte, n)
		for i := 0; i+8 <= n; i += 8 {
			v := rng.Uint64()
			for j := range 8 {
				b[i+j] = byte(v >> (8 * j))
			}
		}
		return os.WriteFile(p, b, 0o644)
	}
	if err := os.MkdirAll(filepath.Join(dir, "blobs"), 0o755); err != nil {
		return err
	}
	for i := range 100 {
		if err := random(filepath.Join(dir, "blobs", fmt.Sprintf("b%03d", i)), 1<<20); err != nil {
			return err
		}
	}
	if err := random(filepath.Join(dir, "blobs", "pack"), 200<<20); err != nil {
		return err
	}
	var log strings.Builder
	for i := 0; log.Len() < 150<<20; i++ {
		fmt.Fprintf(&log, "2026-12-02T03:%02d:%02d.%06dZ INFO step=%d worker=%d took %dms status=ok path=/home/task/repo/pkg/%x\n",
			i/60%60, i%60, i%1000000, i, i%16, rng.IntN(5000), rng.Uint32())
	}
	return os.WriteFile(filepath.Join(dir, "build.log"), []byte(log.String()), 0o644)
}

func treeSize(dir string) (data int64, files int, err error) {
	err = filepath.WalkDir(dir, func(_ string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.Type().IsRegular() {
			fi, err := d.Info()
			if err != nil {
				return err
			}
			data += fi.Size()
			files++
		}
		return nil
	})
	return data, files, err
}

func round(x float64) float64 { return float64(int64(x*100+0.5)) / 100 }

func load() string {
	b, _ := os.ReadFile("/proc/loadavg")
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}
