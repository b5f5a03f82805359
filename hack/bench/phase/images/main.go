// Package images is the images phase of hack/bench: the node's image store
// (executor/image) against the reference tool on the same image, served by
// a registry on the machine (internal/rig/registry), and prints one table:
//
//   - first use: Store.Pull of the image into an empty store against
//     `crane export REF - | tar -x` into an empty directory
//     (go-containerregistry's cmd/crane at the version of go.mod), each
//     timed after a sync, in an order that alternates over -rounds rounds; the medians
//     in seconds and the ratio crane/ours (the target: at least 1.0,
//     docs/performance.md), with the fastest round of each and the
//     median of the rounds' own ratios, steadier on a busy machine. Ours includes the store's syncfs and record
//     writes; the reference syncs nothing, so a second line adds
//     `sync -f` of its tree, timed after it;
//   - a second pull of the same image, the layers present: the median
//     latency of -cached pulls by tag (the tag resolved at the registry)
//     and by digest (the registry not asked);
//   - disk: the store's bytes on disk (du, hard links counted once) after
//     one pull against the reference's unpacked tree, and again after
//     -acquires Acquire and Release of the image: one copy whatever the
//     number of uses.
//
// The image is bin/images/bashtask-task.tar (the Debian task image, `go run
// ./hack/images -only task`) when it is there, else a generated image of
// four layers of mixed files, -mib MiB of tar in all. Needs root (the
// store keeps the layers' owners), tar and the Go toolchain (to build
// crane when -crane is empty).
package images

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/v1/tarball"

	imagestore "github.com/bashtask/bashtask-operator/executor/image"
	"github.com/bashtask/bashtask-operator/hack/bench/phase"
	"github.com/bashtask/bashtask-operator/hack/bench/report"
	"github.com/bashtask/bashtask-operator/hack/bench/stats"
	"github.com/bashtask/bashtask-operator/internal/rig/registry"
)

// Phase is the images phase.
type Phase struct {
	archive, crane                string
	mib, rounds, cached, acquires int
}

// Name is "images".
func (*Phase) Name() string { return "images" }

// Flags registers the phase's flags.
func (p *Phase) Flags(fs *flag.FlagSet) {
	fs.StringVar(&p.archive, "archive", filepath.Join("bin", "images", "bashtask-task.tar"), "docker-archive of the image to pull; when missing, a generated image of -mib MiB")
	fs.IntVar(&p.mib, "mib", 300, "MiB of tar of the generated image")
	fs.IntVar(&p.rounds, "rounds", 3, "rounds of the first use, ours and the reference's")
	fs.IntVar(&p.cached, "cached", 50, "pulls of the image already in the store, by tag and by digest each")
	fs.IntVar(&p.acquires, "acquires", 200, "Acquire and Release of the image before the second disk figure")
	fs.StringVar(&p.crane, "crane", "", "crane binary; empty builds go-containerregistry's cmd/crane at go.mod's version")
}

// Run measures and prints the images' table.
func (p *Phase) Run(ctx context.Context, _ *phase.Env) (phase.Figures, error) {
	if os.Geteuid() != 0 {
		return nil, fmt.Errorf("the images phase needs root: the store keeps the layers' owners")
	}
	work, err := os.MkdirTemp("", "bench-images-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(work)
	crane, err := craneBinary(ctx, p.crane, work)
	if err != nil {
		return nil, err
	}
	reg, err := registry.Start(registry.Options{Dir: filepath.Join(work, "registry")})
	if err != nil {
		return nil, err
	}
	defer reg.Close()
	ref, what, err := p.pushImage(ctx, reg, work)
	if err != nil {
		return nil, err
	}
	fmt.Printf("image: %s, %s; GOMAXPROCS default, load %s\n", ref, what, phase.LoadAvg())
	return p.measure(ctx, ref, crane, reg.Dir(), work)
}

// pushImage pushes the archive, or a generated image, to reg and returns
// its reference by tag and a description.
func (p *Phase) pushImage(ctx context.Context, reg *registry.Registry, work string) (string, string, error) {
	if _, err := os.Stat(p.archive); err == nil {
		img, err := tarball.ImageFromPath(p.archive, nil)
		if err != nil {
			return "", "", fmt.Errorf("reading %s: %w", p.archive, err)
		}
		if _, err := reg.Push(ctx, img, "bench/task", "bench"); err != nil {
			return "", "", err
		}
		return reg.Ref("bench/task", "bench"), "the task image of " + p.archive, nil
	}
	fmt.Printf("%s is missing: generating an image of %d MiB of tar\n", p.archive, p.mib)
	img, err := generatedImage(filepath.Join(work, "gen"), p.mib)
	if err != nil {
		return "", "", err
	}
	if _, err := reg.Push(ctx, img, "bench/generated", "bench"); err != nil {
		return "", "", err
	}
	return reg.Ref("bench/generated", "bench"), fmt.Sprintf("generated, %d MiB of tar in 4 layers", p.mib), nil
}

// firstUse holds the first-use figures: seconds per round.
type firstUse struct {
	ours, ref []float64
	// sync is the seconds of `sync -f` on the reference's tree after
	// each of its rounds: what writing it to disk, as the store does,
	// adds.
	sync []float64
	// refTree is the reference's unpacked tree of the last round, kept
	// for the disk figure.
	refTree string
}

// measure runs the three measurements and prints the table.
func (p *Phase) measure(ctx context.Context, ref, crane, regDir, work string) (phase.Figures, error) {
	fu, err := p.firstUse(ctx, ref, crane, regDir, work)
	if err != nil {
		return nil, err
	}
	refBytes, err := diskBytes(fu.refTree)
	if err != nil {
		return nil, err
	}
	c, err := p.cachedAndDisk(ctx, ref, filepath.Join(work, "store-cached"))
	if err != nil {
		return nil, err
	}
	ours, theirs := stats.Median(fu.ours), stats.Median(fu.ref)
	var synced []float64
	for i := range fu.ref {
		synced = append(synced, fu.ref[i]+fu.sync[i])
	}
	theirsSynced := stats.Median(synced)
	var pairs []float64
	for i := range fu.ref {
		pairs = append(pairs, fu.ref[i]/fu.ours[i])
	}
	bestOurs, bestTheirs := slices.Min(fu.ours), slices.Min(fu.ref)
	mib := func(b int64) float64 { return float64(b) / (1 << 20) }
	w := report.NewTable(os.Stdout, false)
	fmt.Fprintf(w, "\nfigure\tours\treference\tratio\ttarget\t\n")
	fmt.Fprintf(w, "first use of the image, s (against crane export | tar -x)\t%.2f\t%.2f\t%.2f\t>= 1.0\t\n", ours, theirs, theirs/ours)
	fmt.Fprintf(w, "first use, fastest round, s\t%.2f\t%.2f\t%.2f\t\t\n", bestOurs, bestTheirs, bestTheirs/bestOurs)
	fmt.Fprintf(w, "first use, median of the rounds' ratios\t\t\t%.2f\t\t\n", stats.Median(pairs))
	fmt.Fprintf(w, "first use, s (against crane export | tar -x; sync -f)\t%.2f\t%.2f\t%.2f\t\t\n", ours, theirsSynced, theirsSynced/ours)
	fmt.Fprintf(w, "second pull, by tag, p50 ms\t%.2f\t\t\t\t\n", c.tagP50)
	fmt.Fprintf(w, "second pull, by digest, p50 ms\t%.3f\t\t\t\t\n", c.digestP50)
	fmt.Fprintf(w, "disk after one pull, MiB (against the unpacked tree)\t%.1f\t%.1f\t%.2f\t\t\n", mib(c.disk), mib(refBytes), float64(c.disk)/float64(refBytes))
	fmt.Fprintf(w, "disk after %d Acquire/Release, MiB\t%.1f\t\t\t= one copy\t\n", p.acquires, mib(c.diskAfter))
	fmt.Fprintf(w, "store's file data (Store.Bytes), MiB\t%.1f\t\t\t\t\n", mib(c.storeBytes))
	w.Flush()
	return phase.Figures{
		"images.first_use_s": round(ours), "images.crane_tar_s": round(theirs), "images.first_use_ratio": round(theirs / ours),
		"images.crane_tar_sync_s": round(theirsSynced), "images.first_use_best_ratio": round(bestTheirs / bestOurs),
		"images.first_use_paired_ratio": round(stats.Median(pairs)), "images.first_use_synced_ratio": round(theirsSynced / ours),
		"images.cached_tag_p50_ms": round(c.tagP50), "images.cached_digest_p50_ms": round(c.digestP50),
		"images.disk_mib": round(mib(c.disk)), "images.unpacked_mib": round(mib(refBytes)),
		"images.disk_after_acquires_mib": round(mib(c.diskAfter)), "images.store_bytes_mib": round(mib(c.storeBytes)),
	}, nil
}

// firstUse times -rounds pulls into an empty store and as many crane
// exports into an empty directory, alternating which goes first, with the
// file systems synced and the registry's blobs read into the page cache
// before each.
func (p *Phase) firstUse(ctx context.Context, ref, crane, regDir, work string) (firstUse, error) {
	var fu firstUse
	for r := range p.rounds {
		storeDir, treeDir := filepath.Join(work, fmt.Sprintf("store-%d", r)), filepath.Join(work, fmt.Sprintf("tree-%d", r))
		ours := func() error {
			d, err := timed(func() error { return pullOnce(ctx, storeDir, ref) })
			fu.ours = append(fu.ours, d)
			return err
		}
		theirs := func() error {
			if err := os.Mkdir(treeDir, 0o755); err != nil {
				return err
			}
			d, err := timed(func() error { return sh(ctx, fmt.Sprintf("%q export %q - | tar -x -C %q", crane, ref, treeDir)) })
			fu.ref = append(fu.ref, d)
			if err != nil {
				return err
			}
			d, err = timed(func() error { return sh(ctx, fmt.Sprintf("sync -f %q", treeDir)) })
			fu.sync = append(fu.sync, d)
			return err
		}
		ops := []func() error{ours, theirs}
		if r%2 == 1 {
			slices.Reverse(ops)
		}
		for _, op := range ops {
			// Each starts with nothing dirty: the previous one's writes and
			// removals otherwise slow whichever runs next (by up to 3x here).
			if err := sh(ctx, fmt.Sprintf("sync && cat %q/blobs/sha256/* > /dev/null", regDir)); err != nil {
				return fu, err
			}
			if err := op(); err != nil {
				return fu, err
			}
		}
		fmt.Printf("round %d: Store.Pull %.2fs crane export | tar -x %.2fs, then sync -f %.2fs (load %s)\n", r+1, fu.ours[r], fu.ref[r], fu.sync[r], phase.LoadAvg())
		if err := os.RemoveAll(storeDir); err != nil {
			return fu, err
		}
		if r < p.rounds-1 {
			if err := os.RemoveAll(treeDir); err != nil {
				return fu, err
			}
		}
		fu.refTree = treeDir
	}
	return fu, nil
}

// pullOnce opens an empty store at dir, pulls ref and closes the store.
func pullOnce(ctx context.Context, dir, ref string) error {
	s, err := imagestore.Open(dir, imagestore.StoreOptions{})
	if err != nil {
		return err
	}
	im, err := s.Pull(ctx, ref, imagestore.PullOptions{})
	if err != nil {
		s.Close()
		return err
	}
	im.Release()
	return s.Close()
}

// cachedFigures are the second pull's and the disk's figures.
type cachedFigures struct {
	tagP50, digestP50           float64 // milliseconds
	disk, diskAfter, storeBytes int64   // bytes
}

// cachedAndDisk pulls ref into an empty store at dir, measures its disk,
// times -cached pulls by tag and by digest, then Acquires and Releases
// the image -acquires times and measures the disk again.
func (p *Phase) cachedAndDisk(ctx context.Context, ref, dir string) (cachedFigures, error) {
	var c cachedFigures
	s, err := imagestore.Open(dir, imagestore.StoreOptions{})
	if err != nil {
		return c, err
	}
	defer s.Close()
	im, err := s.Pull(ctx, ref, imagestore.PullOptions{})
	if err != nil {
		return c, err
	}
	im.Release()
	if c.disk, err = diskBytes(dir); err != nil {
		return c, err
	}
	byDigest := ref[:strings.LastIndex(ref, ":")] + "@" + im.Digest
	for _, r := range []struct {
		ref string
		p50 *float64
	}{{ref, &c.tagP50}, {byDigest, &c.digestP50}} {
		if *r.p50, err = cachedP50(ctx, s, r.ref, p.cached); err != nil {
			return c, err
		}
	}
	for range p.acquires {
		held, err := s.Acquire(im.ManifestDigest)
		if err != nil {
			return c, err
		}
		held.Release()
	}
	c.storeBytes = s.Bytes()
	c.diskAfter, err = diskBytes(dir)
	return c, err
}

// cachedP50 is the median latency in milliseconds of n pulls of ref, which
// the store s has; a pull that was not a hit is an error.
func cachedP50(ctx context.Context, s *imagestore.Store, ref string, n int) (float64, error) {
	var ms []float64
	for range n {
		start := time.Now()
		im, err := s.Pull(ctx, ref, imagestore.PullOptions{})
		if err != nil {
			return 0, err
		}
		ms = append(ms, float64(time.Since(start).Microseconds())/1000)
		hit := im.Hit
		im.Release()
		if !hit {
			return 0, fmt.Errorf("pull %d of %s fetched a layer again", len(ms), ref)
		}
	}
	return stats.Median(ms), nil
}

func timed(fn func() error) (float64, error) {
	start := time.Now()
	err := fn()
	return time.Since(start).Seconds(), err
}

func sh(ctx context.Context, script string) error {
	cmd := exec.CommandContext(ctx, "bash", "-o", "pipefail", "-c", script)
	cmd.Stderr = os.Stderr
	return cmd.Run()
}

func round(x float64) float64 { return float64(int64(x*100+0.5)) / 100 }
