// Package exampletasks holds what the end-to-end and cluster suites do
// alike, so both check the same promises with the same code: apply the
// manifests of examples/ as a user does and compare each task's outcome
// with its expected reason, run kubectl-bashtask, and read the evidence
// counting commands leave.
package exampletasks

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/bashtask/bashtask-operator/api/v1alpha1"
)

// ExpectReasonAnnotation is the annotation each example task carries: the
// terminal reason it must end with.
const ExpectReasonAnnotation = "bashtask.dev/expect-reason"

// Apply creates every object of dir/*.yaml in namespace ns and returns, by
// name, the expected reason of each BashTask. It fails on the first object
// the API server refuses, naming the file.
func Apply(ctx context.Context, c client.Client, dir, ns string) (map[string]string, error) {
	files, err := filepath.Glob(filepath.Join(dir, "*.yaml"))
	if err != nil {
		return nil, err
	}
	if len(files) == 0 {
		return nil, fmt.Errorf("no examples in %s", dir)
	}
	expect := map[string]string{}
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			return nil, err
		}
		dec := utilyaml.NewYAMLOrJSONDecoder(strings.NewReader(string(data)), 4096)
		for {
			u := &unstructured.Unstructured{}
			if err := dec.Decode(&u.Object); err != nil {
				if errors.Is(err, io.EOF) {
					break
				}
				return nil, fmt.Errorf("%s: %w", filepath.Base(f), err)
			}
			if len(u.Object) == 0 {
				continue
			}
			u.SetNamespace(ns)
			if err := c.Create(ctx, u); err != nil {
				return nil, fmt.Errorf("%s: creating %s %s: %w", filepath.Base(f), u.GetKind(), u.GetName(), err)
			}
			if u.GetKind() == "BashTask" {
				expect[u.GetName()] = u.GetAnnotations()[ExpectReasonAnnotation]
			}
		}
	}
	return expect, nil
}

// Mismatches compares the terminal tasks of done with the expected reasons
// Apply returned and describes, sorted by name, each task that ended
// otherwise or is missing from done.
func Mismatches(expect map[string]string, done map[string]*v1.BashTask) []string {
	var out []string
	for name, want := range expect {
		bt := done[name]
		if bt == nil {
			out = append(out, fmt.Sprintf("%s has not ended, its manifest expects %s", name, want))
			continue
		}
		if got := string(ptr.Deref(bt.Status.Reason, "")); got != want {
			out = append(out, fmt.Sprintf("%s ended %s (%s), its manifest expects %s", name, got, ptr.Deref(bt.Status.Message, ""), want))
		}
	}
	sort.Strings(out)
	return out
}

// RunPlugin runs the kubectl-bashtask binary with --kubeconfig kubeconfig
// and args, the environment of this process plus env, and stdin when not
// empty. code is the exit code, or -1 when the binary could not run (the
// reason is then appended to stderr).
func RunPlugin(ctx context.Context, bin, kubeconfig string, env []string, stdin string, args ...string) (stdout, stderr string, code int) {
	cmd := exec.CommandContext(ctx, bin, append([]string{"--kubeconfig", kubeconfig}, args...)...)
	cmd.Env = append(os.Environ(), env...)
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	if stdin != "" {
		cmd.Stdin = strings.NewReader(stdin)
	}
	err := cmd.Run()
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return o.String(), e.String(), ee.ExitCode()
	} else if err != nil {
		return o.String(), e.String() + err.Error(), -1
	}
	return o.String(), e.String(), 0
}
