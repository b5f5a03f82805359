// Package snapshot archives a workspace's directory tree into one stream
// and restores it into an empty directory, for BashWorkspace snapshots
// (docs/workspaces.md, "Snapshots").
//
// The stream is a POSIX pax tar archive (IEEE Std 1003.1-2001) compressed
// as one zstd frame sequence (RFC 8878). Both are chosen for what they
// keep and who can read them: pax carries file modes, nanosecond
// modification times, symbolic and hard links, FIFOs and names of any
// length; zstd compresses source trees several-fold at disk speed on one
// core (the archiver compresses at klauspost/compress's SpeedFastest,
// about zstd's level 1, on up to four cores for one Write of the process
// at a time, see parallelWrites); and `zstd -dc | tar -x` reads an
// archive by hand. The tree's
// members are named "tree/<path>", the workspace's carried state (the
// carry-over record and variables, which live outside the tree)
// "state/<name>". A sparse file's data ranges are stored packed, with
// the range map in the member's pax record BASHTASK.sparse.map and its
// size in BASHTASK.sparse.size, so that the holes come back as holes; a
// tar that does not know these records extracts the packed bytes.
//
// Ownership is not kept as numbers: the workspace's UID changes on every
// restore (a UID is leased per node), so every member is stored with the
// owner 0, meaning the workspace's owner, and restored as the UID and GID
// the restore is given. A file of another owner in the tree (which a task
// cannot make: it has no CAP_CHOWN) is counted and restored as the
// owner's too, never as someone else's.
//
// Neither direction follows a path a task controls. The archiver walks
// the tree through directory descriptors, one name at a time, opening
// each entry with O_NOFOLLOW and reading a symbolic link's target without
// following it; an entry replaced while it is walked is skipped and
// counted, never followed. The restorer writes only below the root it is
// given, resolving every parent with openat2(RESOLVE_BENEATH |
// RESOLVE_NO_SYMLINKS | RESOLVE_NO_XDEV) and creating every entry
// exclusively (O_EXCL, mkdirat, symlinkat, linkat without following), so
// a member name with "..", an absolute name, a name below a symbolic link
// of the archive, or a hard link to something outside fails the restore
// with an error that names the member.
//
// Consistency: a snapshot of a workspace whose tasks keep writing is
// taken file by file, without stopping them. A file that does not change
// while the archiver reads it is captured exactly. A file that changes
// meanwhile (its size, modification or change time differs after the
// read from before it) is captured with the size it had when reached and
// bytes from some moment during the read, and is named in
// [Stats.Changed]; nothing across files is atomic. A task that needs one
// point in time stops writing while the snapshot runs, or snapshots
// between its tasks.
package snapshot
