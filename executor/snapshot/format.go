package snapshot

import (
	"errors"
	"fmt"
	"path"
	"strconv"
	"strings"
)

// Member name prefixes in the archive.
const (
	// TreePrefix starts the name of every member of the workspace's tree;
	// "tree/" alone is the tree's root.
	TreePrefix = "tree/"
	// StatePrefix starts the name of every member of the workspace's
	// carried state ([StateFile]).
	StatePrefix = "state/"
	// UpperPrefix starts the name of every member of the workspace's
	// overlay upper directory (its tasks' changes to their image, docs/
	// images.md): overlayfs's on-disk format, whiteouts and opaque
	// directories included; "upper/" alone is the upper directory.
	UpperPrefix = "upper/"
)

// Pax records of an overlay upper directory's member.
const (
	// paxOpaque marks an opaque directory of the upper directory, the
	// extended attribute trusted.overlay.opaque=y, in the pax form GNU
	// tar and bsdtar use for extended attributes.
	paxOpaque   = "SCHILY.xattr." + xattrOpaque
	xattrOpaque = "trusted.overlay.opaque"
)

// The trees of an archive: the workspace's, and its overlay upper
// directory.
const (
	treeMain  = 0
	treeUpper = 1
)

// memberName is the archive name of path rel ("" for the root) of tree t.
func memberName(t int, rel string, dir bool) string {
	if t == treeUpper {
		return UpperPrefix + strings.TrimPrefix(treeName(rel, dir), TreePrefix)
	}
	return treeName(rel, dir)
}

// memberPath is treePath for a member of either tree: its tree and path.
func memberPath(name string) (int, string, error) {
	if rest, ok := strings.CutPrefix(name, UpperPrefix); ok {
		rel, err := treePath(TreePrefix + rest)
		if err != nil {
			return 0, "", fmt.Errorf("%w: member %q: the path must be relative and clean, without \".\" or \"..\" elements", ErrFormat, name)
		}
		return treeUpper, rel, nil
	}
	rel, err := treePath(name)
	return treeMain, rel, err
}

// Pax records of the format (vendor keywords, POSIX pax "keyword=value").
const (
	// paxVersion, in the archive's global header, is the format version.
	paxVersion = "BASHTASK.snapshot.version"
	// paxSparseMap is a sparse file's data ranges: "offset,length" pairs
	// separated by ",", in bytes, ascending; the member's data is those
	// ranges back to back.
	paxSparseMap = "BASHTASK.sparse.map"
	// paxSparseSize is a sparse file's size in bytes.
	paxSparseSize = "BASHTASK.sparse.size"
)

// formatVersion is the version this package writes for an archive
// without an overlay upper directory; formatVersionUpper with one (an
// agent that reads only version 1 refuses it rather than restoring the
// workspace without its image's changes). Both are read.
const (
	formatVersion      = "1"
	formatVersionUpper = "2"
)

// Limits of what a restore takes.
const (
	// MaxStateBytes is the largest state member, in bytes (1 MiB): the
	// carried variables are at most 256 KiB (shim.MaxCarryBytes).
	MaxStateBytes = 1 << 20
	// maxSparseRanges bounds a sparse map's ranges, so that a hostile
	// record cannot make the restore allocate without limit.
	maxSparseRanges = 1 << 20
)

// ErrFormat is wrapped by every error about an archive's content: a
// member that is not allowed, a malformed record, an unknown version.
var ErrFormat = errors.New("snapshot archive")

// StateFile is one file of a workspace's carried state, stored as the
// member StatePrefix+Name: it lives in the agent's state directory, not in
// the tree, and goes with the snapshot so that a restore carries on.
type StateFile struct {
	// Name is one path element (no "/").
	Name string
	// Mode holds the permission bits (0600 for the carried variables,
	// which stay readable by the workspace's owner alone, in the
	// archive too).
	Mode uint32
	// Data is the file's content, at most MaxStateBytes.
	Data []byte
}

// Stats describe one archive written or read.
type Stats struct {
	// Dirs, Files, Symlinks, HardLinks and FIFOs count the tree's members
	// by kind (HardLinks: the names after the first of a file).
	Dirs, Files, Symlinks, HardLinks, FIFOs int
	// DataBytes is the bytes of file content, holes not counted.
	DataBytes int64
	// ArchiveBytes and ArchiveSHA256 (hex) are those of the compressed
	// stream, as written or as read.
	ArchiveBytes  int64
	ArchiveSHA256 string
	// Changed lists the tree paths that changed while they were read,
	// and entries replaced or removed during the walk (written only).
	Changed []string
	// Skipped lists tree paths not archived: sockets and device nodes,
	// which a snapshot cannot restore (written only).
	Skipped []string
	// ForeignOwner counts entries whose owner was not the workspace's
	// (written only); they are restored as the owner's.
	ForeignOwner int
	// State lists the state files' names.
	State []string
	// Whiteouts and OpaqueDirs count the overlay upper directory's
	// whiteouts (character devices 0/0: a file of the image deleted) and
	// opaque directories (trusted.overlay.opaque=y).
	Whiteouts, OpaqueDirs int
}

// treeName returns the archive name of the tree path rel ("" for the root).
func treeName(rel string, dir bool) string {
	if rel == "" {
		return TreePrefix
	}
	if dir {
		return TreePrefix + rel + "/"
	}
	return TreePrefix + rel
}

// treePath returns the tree path of an archive member name: relative,
// clean, without "." or ".." elements, "" for the root. The error wraps
// ErrFormat and names the member.
func treePath(name string) (string, error) {
	rel, ok := strings.CutPrefix(name, TreePrefix)
	if !ok {
		return "", fmt.Errorf("%w: member %q is outside %q", ErrFormat, name, TreePrefix)
	}
	rel = strings.TrimSuffix(rel, "/")
	if rel == "" {
		return "", nil
	}
	if strings.ContainsRune(rel, 0) || path.IsAbs(rel) || path.Clean(rel) != rel {
		return "", fmt.Errorf("%w: member %q: the path must be relative and clean", ErrFormat, name)
	}
	for el := range strings.SplitSeq(rel, "/") {
		if el == ".." || el == "." {
			return "", fmt.Errorf("%w: member %q: the path must not have %q elements", ErrFormat, name, el)
		}
	}
	return rel, nil
}

// dataRange is one range of a sparse file's data, in bytes.
type dataRange struct{ off, len int64 }

func formatSparseMap(rs []dataRange) string {
	var b strings.Builder
	for i, r := range rs {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.FormatInt(r.off, 10))
		b.WriteByte(',')
		b.WriteString(strconv.FormatInt(r.len, 10))
	}
	return b.String()
}

// parseSparseMap reads a sparse map and checks it against the file's size
// and the member's data size: ranges ascending, not overlapping, inside
// the file, their lengths adding up to the data.
func parseSparseMap(s string, size, data int64) ([]dataRange, error) {
	if s == "" {
		if data != 0 {
			return nil, fmt.Errorf("an empty map for %d bytes of data", data)
		}
		return nil, nil
	}
	f := strings.Split(s, ",")
	if len(f)%2 != 0 || len(f)/2 > maxSparseRanges {
		return nil, fmt.Errorf("a map of %d numbers: pairs expected, at most %d", len(f), maxSparseRanges)
	}
	rs := make([]dataRange, 0, len(f)/2)
	end, sum := int64(0), int64(0)
	for i := 0; i < len(f); i += 2 {
		off, err1 := strconv.ParseInt(f[i], 10, 64)
		n, err2 := strconv.ParseInt(f[i+1], 10, 64)
		if err1 != nil || err2 != nil || off < end || n <= 0 || off > size-n {
			return nil, fmt.Errorf("range %s,%s: ascending ranges inside the file's %d bytes expected", f[i], f[i+1], size)
		}
		rs = append(rs, dataRange{off, n})
		end, sum = off+n, sum+n
	}
	if sum != data {
		return nil, fmt.Errorf("ranges of %d bytes for %d bytes of data", sum, data)
	}
	return rs, nil
}
