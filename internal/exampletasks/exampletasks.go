// Package exampletasks applies the manifests of examples/ the way the
// end-to-end and cluster suites (and a user) do, and reads the evidence
// counting commands leave, so both suites check the same promises with the
// same code.
package exampletasks

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/controller-runtime/pkg/client"
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

// CountRuns reads a directory where counting commands append one line per
// execution to a file named after the task's UID (optionally with prefix),
// and returns the number of lines by UID.
func CountRuns(dir, prefix string) (map[string]int, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	out := map[string]int{}
	for _, e := range entries {
		f, err := os.Open(filepath.Join(dir, e.Name()))
		if err != nil {
			return nil, err
		}
		n := 0
		for s := bufio.NewScanner(f); s.Scan(); {
			n++
		}
		_ = f.Close()
		out[strings.TrimPrefix(e.Name(), prefix)] = n
	}
	return out, nil
}
