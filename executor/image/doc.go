// Package image is a node's store of OCI and Docker images for tasks'
// overlay roots (docs/images.md, "The node's image store"): [Store.Pull]
// resolves a reference, fetches the image for linux and the node's
// architecture with go-containerregistry, and unpacks each layer once per
// node, content-addressed by its diffID, into a directory of its own; the
// image's layer directories, topmost first, are the lower layers of an
// overlay. Images are held while in use ([Store.Acquire],
// [Image.Release]) and the least recently used others are evicted to keep
// the store within a disk budget.
//
// # On-disk layout
//
// Under the root (mode 0700: layers keep their set-ID files, for an
// overlay mounted nosuid):
//
//	lock                          flock(2)ed by the one Store open on the root
//	layers/sha256-<hex>/          one layer, unpacked; <hex> is its diffID's
//	l/<16 hex>                    -> ../layers/sha256-<hex>: the short link
//	images/sha256-<hex>.json      an image's record, by its manifest digest:
//	                              the digests references resolved to, the
//	                              config, the diffIDs (base first), each
//	                              layer's unpacked bytes, the last use
//	tmp/                          layers being unpacked, records being
//	                              written, layers being removed
//
// A layer is unpacked into tmp/, the file system synced (syncfs(2)), and
// renamed into layers/ only when complete: a half-unpacked layer is never
// under layers/. An image's record is written after its layers, into tmp/
// and renamed. [Open] empties tmp/ (an interrupted pull starts its layer
// again), and removes records whose layers are missing and layers no
// record uses.
//
// Overlayfs takes at most 500 lower layers, and on kernels before 6.8
// (no `lowerdir+`) all of a mount's options in one page, 4096 bytes: an
// image has at most [MaxLayers] (128) layers, and [Image.LowerDir] names
// them by their short links (19 bytes each) for a mount whose working
// directory is the store's root, as Docker's overlay2 does.
//
// # Unpacking
//
// Members are written below the layer's directory only: every parent is
// opened with openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS |
// RESOLVE_NO_MAGICLINKS | RESOLVE_NO_XDEV) and every entry created
// relative to it with O_EXCL or its *at(2) call, never following a link.
// A member whose name is absolute or has a ".." component, or whose
// directory is a symbolic link of the layer, fails the pull with a
// [MemberError] naming the layer's digest and the member. Missing parent
// directories are made 0755 and root's, as tar does; a later member of
// the same name replaces an earlier one.
//
// Kept: regular files, directories, symbolic links (their targets as
// stored), hard links to entries made earlier by the same layer (a hard
// link to a file that is not in the layer, such as one of a lower layer,
// is refused, not copied), FIFOs; the numeric owners of the tar, modes
// with the set-user-ID, set-group-ID and sticky bits, modification
// times, and the extended attributes of PAX SCHILY.xattr records named
// user.* and security.capability (on regular files and directories; a
// file system without them skips them). Other attributes are dropped:
// trusted.* would steer overlayfs (opaque, redirect, metacopy), the other
// security.* are the node's labels, system.* ACLs. Every entry gets its
// owner first, then its mode (chown(2) clears set-ID bits and file
// capabilities), then its attributes and time; directories take their
// mode and time after their entries.
//
// Holes: every aligned 4096-byte block of zeros in a regular file is
// seeked over, not written, and the file truncated to its size, so a
// sparse file stays sparse (whatever the tar's format).
//
// Device nodes (character and block members, such as /dev/console) are
// skipped and counted: the task gets its own /dev. Whiteouts take
// overlayfs's form: `.wh.NAME` becomes a character device 0/0 named NAME,
// `.wh..wh..opq` sets trusted.overlay.opaque=y on its directory (both
// need root); other `.wh..wh.` names (aufs metadata) are skipped.
//
// The uncompressed stream's SHA-256 must equal the layer's diffID, or
// the pull fails with [ErrInvalid]; a blob whose download does not match
// its digest (checked by go-containerregistry) fails it with a retryable
// error.
package image
