package executor

import "time"

// ForkStats says how CopyImageFrozen copied a workspace's file system.
type ForkStats struct {
	// Method is ForkReflink or ForkSparseCopy.
	Method ForkMethod
	// Time is when this copy's hold on the freeze began: the instant the
	// copy is of.
	Time time.Time
	// Frozen is how long this copy held the source frozen.
	Frozen time.Duration
	// CopiedBytes is the data the copy wrote, in bytes; 0 for a reflink.
	CopiedBytes int64
}

// ForkMethod is how a workspace's file system image was copied.
type ForkMethod string

const (
	// ForkReflink cloned the image (FICLONE): blocks shared until written.
	ForkReflink ForkMethod = "Reflink"
	// ForkSparseCopy copied the image's data extents (SEEK_DATA,
	// SEEK_HOLE, copy_file_range), leaving its holes holes.
	ForkSparseCopy ForkMethod = "SparseCopy"
)
