package plugin

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/util/validation"

	btclient "github.com/bashtask/bashtask-operator/client"
)

type cpFlags struct {
	timeout   time.Duration
	ttl       time.Duration
	sameOwner bool
}

func (a *app) cpCommand() *cobra.Command {
	var f cpFlags
	cmd := &cobra.Command{
		Use:   "cp SRC DEST",
		Short: "Copy files and directories to and from a workspace",
		Long: `cp copies a file, a directory tree or a symbolic link between the local
machine and a workspace, as "kubectl cp" does for a container. One of SRC
and DEST is WORKSPACE:PATH (or NAMESPACE/WORKSPACE:PATH); a local path with
a colon in it is written with a leading ./ or /. PATH is relative to the
workspace's root (/home/task), or absolute with the root as / (a leading
/home/task is the root too); it cannot leave the workspace.

Where the copy lands, as with kubectl cp:
  cp LOCAL W:PATH   PATH an existing directory: LOCAL goes inside it as
                    PATH/<name of LOCAL>; otherwise it becomes PATH (its
                    parent must exist). An existing file is replaced.
  cp W:PATH LOCAL   a directory becomes LOCAL (made when missing, merged
                    into when it exists); a file becomes LOCAL, or goes
                    inside it when LOCAL is an existing directory.

Modes (less set-user-ID and set-group-ID), symbolic links (as links), empty
directories and modification times are kept; copied files belong to the
workspace's UID there and to you here. The copy runs as a task of the
workspace with the workspace's owner, reading or writing a tar archive
(GNU tar in the workspace); the task is deleted when the copy is done. The
local side never writes outside DEST, whatever names the archive holds.
Downloads are at most 16 GiB of archive. See docs/workspaces.md.`,
		Example: `  kubectl bashtask cp ./src s1:src            # ./src becomes ~/src (or ~/src/src when it exists)
  kubectl bashtask cp s1:src/out.log .         # ./out.log
  kubectl bashtask cp -n team-a s1:build ./build`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			return a.cp(cmd.Context(), args[0], args[1], f)
		},
	}
	cmd.Flags().DurationVar(&f.timeout, "timeout", btclient.DefaultCopyTimeout, "spec.timeoutSeconds of the copy's task (whole seconds; "+
		"at most the controller's --max-timeout-seconds, 600s unless its administrator changed it)")
	cmd.Flags().BoolVar(&f.sameOwner, "same-owner", false, "copying out: give the local files the archive's numeric owners and keep set-user-ID and set-group-ID bits, "+
		"as tar --same-owner (root only); without it every file is yours and no set-ID bit is kept")
	cmd.Flags().DurationVar(&f.ttl, "ttl", time.Hour, "spec.ttlSecondsAfterFinished of the copy's task, which cp deletes when done: "+
		"how long it is kept should that fail; 0 keeps it")
	return cmd
}

// remoteSpec is a parsed WORKSPACE:PATH.
type remoteSpec struct {
	namespace, workspace, path string
}

// parseRemote reads arg as [NAMESPACE/]WORKSPACE:PATH, the way kubectl
// cp reads POD:PATH: a path starting with / or . is local, and so is one
// without a colon. ok is false for a local path; err names a remote one
// whose names are not valid.
func parseRemote(arg string) (spec remoteSpec, ok bool, err error) {
	if strings.HasPrefix(arg, "/") || strings.HasPrefix(arg, ".") {
		return spec, false, nil
	}
	before, p, found := strings.Cut(arg, ":")
	if !found || before == "" {
		return spec, false, nil
	}
	ns, ws, hasNS := strings.Cut(before, "/")
	if !hasNS {
		ns, ws = "", before
	}
	if hasNS {
		if errs := validation.IsDNS1123Label(ns); len(errs) > 0 {
			return spec, true, fmt.Errorf("%q: namespace %q: %s", arg, ns, strings.Join(errs, "; "))
		}
	}
	if errs := validation.IsDNS1123Subdomain(ws); len(errs) > 0 {
		return spec, true, fmt.Errorf("%q: workspace %q: %s (a local path with a colon is written ./%s)", arg, ws, strings.Join(errs, "; "), arg)
	}
	return remoteSpec{namespace: ns, workspace: ws, path: p}, true, nil
}

func (a *app) cp(ctx context.Context, src, dest string, f cpFlags) error {
	if f.timeout%time.Second != 0 || f.timeout < time.Second || f.timeout > maxTimeoutSeconds*time.Second {
		return fmt.Errorf("--timeout %s: whole seconds from 1s to %ds", f.timeout, maxTimeoutSeconds)
	}
	rs, srcRemote, err := parseRemote(src)
	if err != nil {
		return err
	}
	rd, destRemote, err := parseRemote(dest)
	if err != nil {
		return err
	}
	switch {
	case srcRemote && destRemote:
		return errors.New("cp: SRC and DEST are both in workspaces; copy through a local directory")
	case !srcRemote && !destRemote:
		return errors.New("cp: one of SRC and DEST must be WORKSPACE:PATH")
	case f.sameOwner && !srcRemote:
		return errors.New("cp: --same-owner is for a copy out of a workspace; a copy into one always gives the files to the workspace's UID")
	}
	cfg, ns, err := a.restConfig()
	if err != nil {
		return err
	}
	bc, err := btclient.New(cfg)
	if err != nil {
		return fmt.Errorf("creating the API client: %w", err)
	}
	ctx, stop := a.cancelOnInterrupt(ctx)
	defer stop()
	if f.ttl < 0 {
		return fmt.Errorf("--ttl %s: must not be negative (0 leaves the controller's default TTL, an hour unless configured)", f.ttl)
	}
	opts := btclient.CopyOptions{Timeout: f.timeout, TTL: f.ttl, SameOwner: f.sameOwner}
	if f.ttl == 0 {
		opts.TTL = -1 // unset: kept
	}
	if srcRemote {
		if rs.namespace != "" {
			ns = rs.namespace
		}
		return bc.CopyFrom(ctx, ns, rs.workspace, rs.path, dest, opts)
	}
	if rd.namespace != "" {
		ns = rd.namespace
	}
	return bc.CopyTo(ctx, ns, rd.workspace, src, rd.path, opts)
}
