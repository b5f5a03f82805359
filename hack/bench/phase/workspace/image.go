package workspace

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	agentv1 "github.com/bashtask/bashtask-operator/api/agent/v1"
	"github.com/bashtask/bashtask-operator/executor/agent"
	"github.com/bashtask/bashtask-operator/hack/bench/report"
	"github.com/bashtask/bashtask-operator/internal/rig/nodeimages"
	"github.com/bashtask/bashtask-operator/internal/rig/registry"
)

// The image run (docs/performance.md, "Workspaces in one image"), on one
// agent with an image store: a first workspace pulls the image; then
// -image-n workspaces without an image and as many in it are made in
// turn, for their latencies; all are deleted; then the image's first
// workspace again, the baseline sample, and -image-n workspaces in the
// image: what each costs beyond the image's one copy.

// imageRun is the image run's figures.
type imageRun struct {
	network, image string
	n              int
	// pull is the first workspace's EnsureWorkspace until made: the
	// image's pull and unpack included.
	pull time.Duration
	// plain and inImage are the create latencies of the n workspaces
	// without and with the image.
	plain, inImage []time.Duration
	// before and with are sampled after the first workspace, and with
	// the n further ones in the image.
	before, with sample
	// storeBytes is the image store's disk use (du) with them.
	storeBytes int64
}

// pushTaskImage builds the task image kind (internal/rig/nodeimages; the
// Debian one is cached in bin/images/cache after its first build) and
// pushes it to a registry of this process on top. It returns the
// registry, to close, and the image's reference.
func pushTaskImage(ctx context.Context, kind, top string) (*registry.Registry, string, error) {
	built, err := nodeimages.Build(ctx, nodeimages.Options{
		RepoRoot: ".", OutDir: filepath.Join("bin", "images"), Tag: "bench", Only: []nodeimages.Kind{nodeimages.Kind(kind)}, Log: io.Discard,
	})
	if err != nil {
		return nil, "", fmt.Errorf("building the %s image (run from the repository): %w", kind, err)
	}
	reg, err := registry.Start(registry.Options{Dir: filepath.Join(top, "registry")})
	if err != nil {
		return nil, "", err
	}
	d, err := reg.PushArchive(ctx, built[0].Archive, built[0].Ref)
	if err != nil {
		return nil, "", errors.Join(err, reg.Close())
	}
	return reg, reg.Ref(d.RepositoryStr(), "bench"), nil
}

// runImages makes the image run of each network and adds its figures.
func runImages(p *Phase, networks []string, size int64, top, shimPath string, figures map[string]float64) error {
	ctx := context.Background()
	reg, ref, err := pushTaskImage(ctx, p.image, top)
	if err != nil {
		return err
	}
	defer reg.Close()
	for _, network := range networks {
		r, err := runImage(p.imageN, network, size, top, shimPath, reg.Host(), ref)
		if err != nil {
			return fmt.Errorf("image run, network %s: %w", network, err)
		}
		r.print(os.Stdout)
		r.addFigures(figures)
	}
	return nil
}

// runImage makes the image run of network with n workspaces of the image
// ref, served by the registry at host.
func runImage(n int, network string, size int64, top, shimPath, host, ref string) (_ *imageRun, err error) {
	dir, err := os.MkdirTemp(top, "image-"+strings.ToLower(network)+"-")
	if err != nil {
		return nil, err
	}
	cfg := agentConfig(2*n+2, network, size, dir, shimPath)
	cfg.Images = agent.ImageConfig{CacheDir: filepath.Join(dir, "images"), PlainHTTP: []string{host}, CacheBytes: -1}
	if err := os.Mkdir(cfg.Executor.WorkDirRoot, 0o755); err != nil {
		return nil, err
	}
	a, err := startAgent(cfg, dir)
	if err != nil {
		return nil, err
	}
	defer func() {
		if cerr := a.stop(); err == nil {
			err = cerr
		}
	}()
	ctx := context.Background()
	made := &madeWorkspaces{a: a}
	defer func() {
		// Whatever fails half-way, what was made is deleted.
		if derr := made.deleteAll(ctx); err == nil {
			err = derr
		}
	}()
	r := &imageRun{network: network, image: ref, n: n}
	img := &agentv1.ImageSpec{Reference: ref}
	first, err := made.create(ctx, 1, network, img)
	if err != nil {
		return nil, fmt.Errorf("the first workspace in %s: %w", ref, err)
	}
	r.pull = first[0]
	// Latency: one without and one in the image, in turn, so that both
	// see the same node (the loop devices and the file system's state
	// change as workspaces are made).
	for range n {
		d, err := made.create(ctx, 1, network, nil)
		if err != nil {
			return nil, err
		}
		r.plain = append(r.plain, d...)
		if d, err = made.create(ctx, 1, network, img); err != nil {
			return nil, err
		}
		r.inImage = append(r.inImage, d...)
	}
	if err := made.deleteAll(ctx); err != nil {
		return nil, err
	}
	// Disk and memory: the image's first workspace again, then n more.
	if _, err := made.create(ctx, 1, network, img); err != nil {
		return nil, err
	}
	state, work := cfg.StateDir, cfg.Executor.WorkDirRoot
	r.before = measure(state, work)
	if _, err = made.create(ctx, n, network, img); err != nil {
		return nil, err
	}
	r.with = measure(state, work)
	r.storeBytes = duBytes(cfg.Images.CacheDir)
	return r, nil
}

// madeWorkspaces creates workspaces on an agent and deletes them.
type madeWorkspaces struct {
	a    *runningAgent
	uids []string
	next int
}

// create makes n workspaces of network, in img when set, one after the
// other, each polled until made (a workspace whose image is not on the
// node is answered image_pull until its pull ends). It returns each one's
// latency.
func (m *madeWorkspaces) create(ctx context.Context, n int, network string, img *agentv1.ImageSpec) ([]time.Duration, error) {
	var out []time.Duration
	for range n {
		m.next++
		uid := fmt.Sprintf("bench-image-%d-%04d", os.Getpid(), m.next)
		spec := &agentv1.WorkspaceSpec{
			Ref:     &agentv1.WorkspaceRef{Namespace: "bench", Name: fmt.Sprintf("img-%04d", m.next), Uid: uid},
			Network: network, CarryWorkingDir: true, Image: img,
		}
		begin := time.Now()
		for {
			resp, err := m.a.ws.EnsureWorkspace(ctx, &agentv1.EnsureWorkspaceRequest{Spec: spec})
			if err != nil {
				return nil, fmt.Errorf("workspace %s: %w", spec.GetRef().GetName(), err)
			}
			if f := resp.GetImageFailure(); f != nil {
				return nil, fmt.Errorf("workspace %s: the image failed: %s: %s", spec.GetRef().GetName(), f.GetReason(), f.GetMessage())
			}
			if resp.GetImagePull() == nil {
				break
			}
			time.Sleep(5 * time.Millisecond)
		}
		out = append(out, time.Since(begin))
		m.uids = append(m.uids, uid)
	}
	return out, nil
}

// deleteAll deletes every workspace made.
func (m *madeWorkspaces) deleteAll(ctx context.Context) error {
	for len(m.uids) > 0 {
		uid := m.uids[len(m.uids)-1]
		if _, err := m.a.ws.DeleteWorkspace(ctx, &agentv1.DeleteWorkspaceRequest{Uid: uid}); err != nil {
			return fmt.Errorf("deleting workspace %s: %w", uid, err)
		}
		m.uids = m.uids[:len(m.uids)-1]
	}
	return nil
}

// duBytes returns the blocks of the files under dir, each inode once
// (the store hard-links within a layer).
func duBytes(dir string) int64 {
	seen := map[uint64]bool{}
	var n int64
	_ = filepath.WalkDir(dir, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return nil
		}
		fi, err := d.Info()
		if err != nil {
			return nil
		}
		if st, ok := fi.Sys().(*syscall.Stat_t); ok && !seen[st.Ino] {
			seen[st.Ino] = true
			n += st.Blocks * 512
		}
		return nil
	})
	return n
}

func (r *imageRun) print(w io.Writer) {
	tw := report.NewTable(w, true)
	fmt.Fprintf(tw, "%d workspaces in one image, network %s\twithout an image\tin %s\tdifference\t\n", r.n, r.network, r.image)
	p50, p99 := pct(r.plain, 50), pct(r.inImage, 50)
	fmt.Fprintf(tw, "create (EnsureWorkspace until made), p50\t%v\t%v\t%+v\t\n", p50, p99, (p99 - p50).Round(10*time.Microsecond))
	fmt.Fprintf(tw, "create, p99\t%v\t%v\t\t\n", pct(r.plain, 99), pct(r.inImage, 99))
	fmt.Fprintf(tw, "first workspace in the image (pull and unpack included)\t\t%v\t\t\n", r.pull.Round(time.Millisecond))
	fmt.Fprintf(tw, "image store on disk (du, the one copy), MiB\t\t%.1f\t\t\n", float64(r.storeBytes)/(1<<20))
	fmt.Fprintf(tw, "beyond the one copy: disk of the state directory, KiB per workspace\t\t%.1f\t\t\n", float64(r.with.diskBytes-r.before.diskBytes)/1024/float64(r.n))
	fmt.Fprintf(tw, "beyond the one copy: agent VmRSS, KiB per workspace\t\t%.1f\t\t\n", float64(r.with.rssKB-r.before.rssKB)/float64(r.n))
	fmt.Fprintf(tw, "beyond the one copy: node Slab, KiB per workspace (node-wide)\t\t%.1f\t\t\n", float64(r.with.meminfo["Slab"]-r.before.meminfo["Slab"])/float64(r.n))
	_ = tw.Flush()
	fmt.Fprintln(w)
}

func (r *imageRun) addFigures(m map[string]float64) {
	p := "workspaces.image." + strings.ToLower(r.network) + "."
	ms := func(d time.Duration) float64 { return round(float64(d) / float64(time.Millisecond)) }
	m[p+"create_plain_p50_ms"] = ms(pct(r.plain, 50))
	m[p+"create_image_p50_ms"] = ms(pct(r.inImage, 50))
	m[p+"first_pull_ms"] = ms(r.pull)
	m[p+"store_mib"] = round(float64(r.storeBytes) / (1 << 20))
	m[p+"disk_kib_per_workspace"] = round(float64(r.with.diskBytes-r.before.diskBytes) / 1024 / float64(r.n))
	m[p+"rss_kib_per_workspace"] = round(float64(r.with.rssKB-r.before.rssKB) / float64(r.n))
}
