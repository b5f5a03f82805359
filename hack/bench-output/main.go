// Command bench-output measures the output API (docs/output.md) on a local
// cluster (internal/localcluster, one agent, file:// objects):
//
//   - latency: a command prints its clock ($EPOCHREALTIME, no fork) on a
//     line every 10 ms; a client follows bashtasks/log through
//     kube-apiserver and takes, per line, its arrival time minus the time
//     in it (same host, same clock). Targets: p50 <= 50 ms, p99 <= 250 ms.
//   - throughput: one follower of a stream of -bytes (1 GiB) written at
//     once, from its first byte to the end. Target: >= 100 MB/s.
//
// Run with `go run ./hack/bench-output` after `make build` and with the
// control-plane binaries in bin/k8s.
package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/utils/ptr"
	ctrlclient "sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/bashtask/bashtask-operator/api/v1alpha1"
	"github.com/bashtask/bashtask-operator/client"
	"github.com/bashtask/bashtask-operator/internal/localcluster"
)

func main() {
	var (
		binDir, assetsDir, crdDir, isolation string
		lines                                int
		size                                 int64
	)
	flag.StringVar(&binDir, "bin-dir", "bin", "directory of bashtask-controller and bashtask-agent")
	flag.StringVar(&assetsDir, "assets-dir", filepath.Join("bin", "k8s"), "directory of kube-apiserver and etcd")
	flag.StringVar(&crdDir, "crd-dir", filepath.Join("config", "crd", "bases"), "CRD manifests")
	flag.StringVar(&isolation, "isolation", "process", "isolation level of the agent")
	flag.IntVar(&lines, "lines", 1000, "timestamped lines of the latency phase, one per 10 ms")
	flag.Int64Var(&size, "bytes", 1<<30, "bytes of the throughput phase's stream")
	flag.Parse()
	if err := run(context.Background(), binDir, assetsDir, crdDir, isolation, lines, size); err != nil {
		fmt.Fprintln(os.Stderr, "bench-output:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, binDir, assetsDir, crdDir, isolation string, lines int, size int64) error {
	dir, err := os.MkdirTemp("", "bench-output-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	c, err := localcluster.Up(ctx, localcluster.LauncherOptions{
		Dir: dir, BinDir: binDir, AssetsDir: assetsDir, CRDDir: crdDir, Agents: 1, Isolation: isolation,
		Log: slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		return err
	}
	defer c.Down()
	cfg, err := clientcmd.BuildConfigFromFlags("", c.Kubeconfig)
	if err != nil {
		return err
	}
	scheme, err := localcluster.NewScheme()
	if err != nil {
		return err
	}
	k8s, err := ctrlclient.New(cfg, ctrlclient.Options{Scheme: scheme})
	if err != nil {
		return err
	}
	oc, err := client.New(cfg)
	if err != nil {
		return err
	}

	// Latency.
	lat := &v1.BashTask{}
	lat.Namespace, lat.Name = "default", "bench-latency"
	lat.Spec.Command = fmt.Sprintf(`for ((i = 0; i < %d; i++)); do printf '%%s\n' "$EPOCHREALTIME"; sleep 0.01; done`, lines)
	if err := k8s.Create(ctx, lat); err != nil {
		return err
	}
	r, err := oc.FollowLog(ctx, lat.Namespace, lat.Name, client.LogOptions{Follow: true})
	if err != nil {
		return err
	}
	var delays []time.Duration
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		now := time.Now()
		sec, frac, _ := strings.Cut(sc.Text(), ".")
		s, err1 := strconv.ParseInt(sec, 10, 64)
		us, err2 := strconv.ParseInt((frac + "000000")[:6], 10, 64)
		if err1 != nil || err2 != nil {
			return fmt.Errorf("line %q is not $EPOCHREALTIME", sc.Text())
		}
		delays = append(delays, now.Sub(time.Unix(s, us*1000)))
	}
	_ = r.Close()
	if err := sc.Err(); err != nil {
		return err
	}
	if len(delays) != lines {
		return fmt.Errorf("latency: %d lines of %d", len(delays), lines)
	}
	slices.Sort(delays)
	q := func(p float64) time.Duration { return delays[min(len(delays)-1, int(p*float64(len(delays))))] }
	fmt.Printf("write-to-client latency over %d lines (10 ms apart): p50 %s, p90 %s, p99 %s, max %s (targets: p50 <= 50ms, p99 <= 250ms)\n",
		len(delays), q(0.50).Round(100*time.Microsecond), q(0.90).Round(100*time.Microsecond), q(0.99).Round(100*time.Microsecond), delays[len(delays)-1].Round(100*time.Microsecond))

	// Throughput.
	tp := &v1.BashTask{}
	tp.Namespace, tp.Name = "default", "bench-throughput"
	tp.Spec.Command = fmt.Sprintf(`head -c %d /dev/zero`, size)
	tp.Spec.Output = &v1.OutputSpec{SpillLimitBytes: ptr.To(size), Upload: ptr.To(v1.UploadNever)}
	if err := k8s.Create(ctx, tp); err != nil {
		return err
	}
	r, err = oc.FollowLog(ctx, tp.Namespace, tp.Name, client.LogOptions{Follow: true})
	if err != nil {
		return err
	}
	first := make([]byte, 1)
	if _, err := io.ReadFull(r, first); err != nil {
		return err
	}
	start := time.Now()
	n, err := io.CopyBuffer(io.Discard, r, make([]byte, 1<<20))
	took := time.Since(start)
	_ = r.Close()
	if err != nil && !errors.Is(err, io.EOF) {
		return err
	}
	if n+1 != size {
		return fmt.Errorf("throughput: followed %d bytes of %d", n+1, size)
	}
	fmt.Printf("one follower of a %d-byte stream: %.0f MB/s (%s from its first byte; target >= 100 MB/s)\n", size, float64(n)/took.Seconds()/1e6, took.Round(time.Millisecond))
	return nil
}
