package main

import (
	"strings"
	"testing"
)

func TestServeRejectsShimPoolSizeOutOfRange(t *testing.T) {
	for _, v := range []string{"-1", "65"} {
		_, err := execute(t, "serve", "--state-dir", t.TempDir(), "--shim-pool-size="+v)
		if err == nil || !strings.Contains(err.Error(), "--shim-pool-size "+v+": want 0 (none) to 64") {
			t.Errorf("serve --shim-pool-size=%s: %v, want the flag's range in the error", v, err)
		}
	}
}
