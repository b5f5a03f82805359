//go:build !linux

package tarcopy

import "errors"

func mkfifo(string) error { return errors.New("not on this platform") }
