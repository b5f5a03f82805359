// Package outputkey names a task's output objects in the bucket (docs/output.md,
// Where the bytes come from): the agents write them, the output API reads
// them, and both must agree on every byte of the key.
package outputkey

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"path"
	"slices"
	"strconv"

	"gocloud.dev/blob"
)

// offsetDigits is the width of a part key's offset: 16 decimal digits hold
// any stream a spill file can (int64 sizes up to about 9 PB), and a fixed
// width makes the bucket list a stream's parts in stream order.
const offsetDigits = 16

// Object is the key of a task's stream: <namespace>/<name>/<uid>/<stream>.
func Object(namespace, name, uid, stream string) string {
	return path.Join(namespace, name, uid, stream)
}

// PartsPrefix is the key prefix of a stream's parts: the stream's key
// followed by ".parts/", so parts never take the key of the stream's
// single object.
func PartsPrefix(objectKey string) string {
	return objectKey + ".parts/"
}

// Part is the key of the part whose first byte is at offset (bytes from
// the stream's start), under prefix.
func Part(prefix string, offset int64) string {
	return fmt.Sprintf("%s%0*d", prefix, offsetDigits, offset)
}

// ParsePart returns the offset of a part key under prefix; false for any
// other key (a driver's side file, another stream's part).
func ParsePart(prefix, key string) (int64, bool) {
	if len(key) != len(prefix)+offsetDigits || key[:len(prefix)] != prefix {
		return 0, false
	}
	digits := key[len(prefix):]
	for _, c := range digits {
		if c < '0' || c > '9' {
			return 0, false // also a sign, which ParseInt would take
		}
	}
	n, err := strconv.ParseInt(digits, 10, 64)
	return n, err == nil
}

// StoredPart is one part of a stream found in the bucket.
type StoredPart struct {
	// Key is the part's key; Offset and End the stream bytes it holds,
	// [Offset, End).
	Key         string
	Offset, End int64
}

// ListParts returns the parts under prefix in bucket b, in stream order,
// skipping keys that are not parts (ParsePart). When the listing fails it
// returns the parts listed before the failure with the bucket's error.
func ListParts(ctx context.Context, b *blob.Bucket, prefix string) ([]StoredPart, error) {
	var parts []StoredPart
	var err error
	it := b.List(&blob.ListOptions{Prefix: prefix})
	for {
		obj, nerr := it.Next(ctx)
		if errors.Is(nerr, io.EOF) {
			break
		}
		if nerr != nil {
			err = nerr
			break
		}
		if off, ok := ParsePart(prefix, obj.Key); ok {
			parts = append(parts, StoredPart{Key: obj.Key, Offset: off, End: off + obj.Size})
		}
	}
	slices.SortFunc(parts, func(a, b StoredPart) int { return cmp.Compare(a.Offset, b.Offset) })
	return parts, err
}
