// Command images builds what a release publishes (the controller, agent
// and pause images and the Task image, bashtask-task, the chart's default
// image of tasks), and with -only any of them, the task-small image or the
// one-node cluster's registry, without a container engine
// (internal/rig/nodeimages) and prints one line per image:
//
//	REF ARCHIVE
//
// where ARCHIVE is a docker-archive tar file for
// `ctr -n k8s.io images import ARCHIVE`. `make images` runs it.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/bashtask/bashtask-operator/internal/rig/nodeimages"
)

func main() {
	var (
		o       nodeimages.Options
		only    string
		created string
	)
	flag.StringVar(&o.RepoRoot, "repo", ".", "the repository's root directory (where go.mod is)")
	flag.StringVar(&o.OutDir, "out", "bin/images", "directory of the archives; the agent's root file system is cached in its cache/ subdirectory")
	flag.StringVar(&o.Tag, "tag", "dev", "tag of every image (not latest)")
	flag.StringVar(&o.Version, "version", "", "org.opencontainers.image.version label; empty means the tag")
	flag.StringVar(&o.Revision, "revision", "", "org.opencontainers.image.revision label (a commit); empty means unknown")
	flag.StringVar(&created, "created", "", "org.opencontainers.image.created label and creation time, RFC 3339; empty means now")
	flag.StringVar(&o.Repository, "repository", nodeimages.DefaultRepository, "prefix of the images' names")
	flag.StringVar(&o.DebianMirror, "debian-mirror", nodeimages.DefaultDebianMirror, "Debian archive of the agent's root file system")
	flag.StringVar(&only, "only", "", "comma-separated images to build (controller, agent, pause, registry, task-small, task); empty builds the controller, agent, pause and task images")
	flag.Parse()
	if flag.NArg() > 0 {
		fatalf("unexpected arguments %q", flag.Args())
	}

	if o.Version == "" {
		o.Version = o.Tag
	}
	if created == "" {
		o.Created = time.Now().UTC().Truncate(time.Second)
	} else {
		t, err := time.Parse(time.RFC3339, created)
		if err != nil {
			fatalf("-created: %v", err)
		}
		o.Created = t
	}
	for k := range strings.SplitSeq(only, ",") {
		if k = strings.TrimSpace(k); k != "" {
			o.Only = append(o.Only, nodeimages.Kind(k))
		}
	}
	if len(o.Only) == 0 {
		o.Only = nodeimages.ReleaseKinds()
	}
	o.Log = os.Stderr

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	images, err := nodeimages.Build(ctx, o)
	if err != nil {
		stop()
		fatalf("%v", err)
	}
	for _, img := range images {
		fmt.Println(img.Ref, img.Archive)
	}
}

func fatalf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "images: "+format+"\n", args...)
	os.Exit(1)
}
