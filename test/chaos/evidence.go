package main

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/bashtask/bashtask-operator/api/v1alpha1"
	"github.com/bashtask/bashtask-operator/internal/procfs"
)

// readCommandStarts reads the lines the commands wrote at their start:
// "<uid> <node> <pid>", in a file per task UID.
func readCommandStarts(dir string, into map[string][]StartRecord) error {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	for _, e := range entries {
		f, err := os.Open(filepath.Join(dir, e.Name()))
		if err != nil {
			return err
		}
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			fields := strings.Fields(sc.Text())
			if len(fields) != 3 {
				continue
			}
			pid, _ := strconv.Atoi(fields[2])
			into[fields[0]] = append(into[fields[0]], StartRecord{Node: fields[1], PID: pid, Source: "command"})
		}
		_ = f.Close()
	}
	return nil
}

// readAgentStarts reads the agent's "task started" log lines (slog text:
// msg="task started" uid=... pid=...) across all its runs.
func readAgentStarts(logPath, node string, into map[string][]StartRecord) error {
	f, err := os.Open(logPath)
	if err != nil {
		return err
	}
	defer func() { _ = f.Close() }()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64*1024), 4*1024*1024)
	for sc.Scan() {
		line := sc.Text()
		if !strings.Contains(line, `msg="task started"`) {
			continue
		}
		uid, pid := "", 0
		for _, kv := range strings.Fields(line) {
			if v, ok := strings.CutPrefix(kv, "uid="); ok {
				uid = v
			} else if v, ok := strings.CutPrefix(kv, "pid="); ok {
				pid, _ = strconv.Atoi(v)
			}
		}
		if uid != "" {
			into[uid] = append(into[uid], StartRecord{Node: node, PID: pid, Source: "agent log"})
		}
	}
	return sc.Err()
}

// liveTaskProcesses returns the processes whose environment carries this
// run's CHAOS_RUN marker, by their BASHTASK_UID.
func liveTaskProcesses(runID string) map[string][]int {
	out := map[string][]int{}
	marker := "CHAOS_RUN=" + runID
	for _, pid := range procfs.PIDs() {
		raw, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "environ"))
		if err != nil {
			continue
		}
		uid, mine := "", false
		for _, kv := range strings.Split(string(raw), "\x00") {
			if kv == marker {
				mine = true
			} else if v, ok := strings.CutPrefix(kv, "BASHTASK_UID="); ok {
				uid = v
			}
		}
		if !mine {
			continue
		}
		if st, err := procfs.ReadStat(pid); err == nil && st.State == 'Z' {
			continue
		}
		out[uid] = append(out[uid], pid)
	}
	return out
}

// readObjects reads every object the final statuses name, keyed by the
// status URL.
func readObjects(ctx context.Context, c *cluster, events map[string][]Observation) map[string]ObjectInfo {
	out := map[string]ObjectInfo{}
	for _, obs := range events {
		if len(obs) == 0 {
			continue
		}
		st := obs[len(obs)-1].Status
		for _, s := range streams(&st) {
			if s.Spill == nil || s.Spill.URL == nil {
				continue
			}
			out[*s.Spill.URL] = readObject(ctx, c, *s.Spill.URL)
		}
	}
	return out
}

func readObject(ctx context.Context, c *cluster, raw string) ObjectInfo {
	u, err := url.Parse(raw)
	if err != nil {
		return ObjectInfo{Err: err.Error()}
	}
	if u.Scheme != "s3" || u.Host != c.bucket {
		return ObjectInfo{Err: fmt.Sprintf("not in the run's bucket s3://%s", c.bucket)}
	}
	resp, err := c.s3Client.GetObject(ctx, &s3.GetObjectInput{Bucket: aws.String(c.bucket), Key: aws.String(strings.TrimPrefix(u.Path, "/"))})
	if err != nil {
		return ObjectInfo{Err: err.Error()}
	}
	defer func() { _ = resp.Body.Close() }()
	h := sha256.New()
	n, err := io.Copy(h, resp.Body)
	if err != nil {
		return ObjectInfo{Err: err.Error()}
	}
	return ObjectInfo{Size: n, SHA256: hex.EncodeToString(h.Sum(nil))}
}

// existingTasks returns the UIDs of the namespace's BashTasks.
func existingTasks(ctx context.Context, c client.Client, ns string) (map[string]bool, error) {
	var list v1.BashTaskList
	if err := c.List(ctx, &list, client.InNamespace(ns)); err != nil {
		return nil, err
	}
	out := map[string]bool{}
	for _, t := range list.Items {
		out[string(t.UID)] = true
	}
	return out, nil
}
