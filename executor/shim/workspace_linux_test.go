//go:build linux

package shim

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// readCarry takes the whole record up to the bound and says when there
// is more, whatever the file's size was when it was first looked at.
func TestReadCarry(t *testing.T) {
	record := []byte("dir=/home/task/sub\x00end\x00")
	for name, tc := range map[string]struct {
		data     []byte
		wantLen  int
		wantOver bool
	}{
		"empty":            {data: nil, wantLen: 0},
		"a record":         {data: record, wantLen: len(record)},
		"at the bound":     {data: bytes.Repeat([]byte{'x'}, MaxCarryBytes), wantLen: MaxCarryBytes},
		"over the bound":   {data: bytes.Repeat([]byte{'x'}, MaxCarryBytes+1), wantLen: MaxCarryBytes, wantOver: true},
		"far over":         {data: bytes.Repeat([]byte{'x'}, 2*MaxCarryBytes), wantLen: MaxCarryBytes, wantOver: true},
		"one byte short":   {data: bytes.Repeat([]byte{'x'}, MaxCarryBytes-1), wantLen: MaxCarryBytes - 1},
		"a few KiB of env": {data: bytes.Repeat([]byte("env=A=b\x00"), 1000), wantLen: 8000},
	} {
		t.Run(name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "carry")
			if err := os.WriteFile(path, tc.data, 0o600); err != nil {
				t.Fatal(err)
			}
			f, err := os.Open(path)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			rec, over := readCarry(int(f.Fd()))
			if len(rec) != tc.wantLen || over != tc.wantOver || !bytes.Equal(rec, tc.data[:tc.wantLen]) {
				t.Errorf("readCarry: %d bytes, over %v; want %d bytes, over %v", len(rec), over, tc.wantLen, tc.wantOver)
			}
		})
	}
}

// preadFull reads from the file's start up to the buffer's end or the
// file's, whichever comes first: readCarry's test of a record that grew
// after its fstat (a full buffer of the size first seen).
func TestPreadFull(t *testing.T) {
	path := filepath.Join(t.TempDir(), "carry")
	if err := os.WriteFile(path, bytes.Repeat([]byte{'y'}, 100), 0o600); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	buf := make([]byte, 10)
	if n := preadFull(int(f.Fd()), buf); n != 10 {
		t.Errorf("preadFull into 10 bytes of a 100-byte file: %d", n)
	}
	buf = make([]byte, 200)
	if n := preadFull(int(f.Fd()), buf); n != 100 {
		t.Errorf("preadFull into 200 bytes of a 100-byte file: %d", n)
	}
}

// Tasks of one workspace that start at once all get its temporary
// directory: the starts that lose the race to make it open the one the
// winner made, and it ends with the mode of a node's /tmp.
func TestOpenWorkspaceTmpConcurrently(t *testing.T) {
	for round := range 50 {
		dir := t.TempDir()
		root, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			t.Fatal(err)
		}
		start := make(chan struct{})
		errs := make(chan error, 8)
		for range 8 {
			go func() {
				<-start
				fd, err := openWorkspaceTmp(root)
				if err == nil {
					unix.Close(fd)
				}
				errs <- err
			}()
		}
		close(start)
		for range 8 {
			if err := <-errs; err != nil {
				t.Fatalf("round %d: %v", round, err)
			}
		}
		unix.Close(root)
		fi, err := os.Stat(filepath.Join(dir, WorkspaceTmpDir))
		if err != nil {
			t.Fatal(err)
		}
		if os.Geteuid() == 0 && fi.Mode()&(os.ModePerm|os.ModeSticky) != os.ModePerm|os.ModeSticky {
			t.Fatalf("round %d: mode %v, want drwxrwxrwt", round, fi.Mode())
		}
	}
}
