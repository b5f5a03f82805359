//go:build !linux

package shim

import (
	"fmt"
	"os"
)

func run() int {
	fmt.Fprintln(os.Stderr, "the task shim runs on Linux only")
	return 127
}

// LandlockABI is 0: Landlock is Linux only.
func LandlockABI() int { return 0 }

func execInside([]string) int {
	fmt.Fprintln(os.Stderr, "the task shim runs on Linux only")
	return 127
}
