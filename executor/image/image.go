package image

import (
	"strings"
	"sync"

	v1 "github.com/google/go-containerregistry/pkg/v1"
)

// Image is an image in the store, held until [Image.Release]: a held
// image is never evicted.
type Image struct {
	// Ref is the reference it was pulled or acquired by.
	Ref string
	// Digest is what the reference resolved to ("sha256:..."): the
	// index's digest when it names an index, else the manifest's. It is
	// what a caller records: `repo@Digest` pulls the same image on any
	// node and never consults a tag.
	Digest string
	// ManifestDigest is the digest of the image manifest for this node's
	// platform, the store's key for the image.
	ManifestDigest string
	// Config is the image's configuration (Env, WorkingDir, User,
	// Entrypoint, Cmd, ...), informational.
	Config v1.Config
	// Layers are the layers' directories, absolute, topmost first: the
	// order of overlayfs's lowerdir.
	Layers []string
	// Links are the layers' short links relative to the store's root
	// ("l/<16 hex digits>"), topmost first; see [Image.LowerDir].
	Links []string
	// DiffIDs are the layers' uncompressed digests, topmost first.
	DiffIDs []string
	// Size is the unpacked size of all its layers in bytes (file data,
	// holes not counted).
	Size int64
	// Hit is true when every layer was in the store before this pull.
	Hit bool
	// Unpacked counts what the layers this pull unpacked held that the
	// store did not make (zero for layers already present).
	Unpacked UnpackCounts

	release   func()
	releaseMu sync.Once
}

// LowerDir is the value of overlayfs's lowerdir option made of the short
// links, for a mount made with the store's root as working directory (as
// Docker's overlay2 does): 19 bytes a layer, so that [MaxLayers] layers
// fit the 4096 bytes of a mount's options. An absolute lowerdir is
// strings.Join(Layers, ":").
func (im *Image) LowerDir() string { return strings.Join(im.Links, ":") }

// Release drops this hold on the image; once nothing holds it, it may be
// evicted. Calling it again does nothing.
func (im *Image) Release() {
	if im.release != nil {
		im.releaseMu.Do(im.release)
	}
}

// UnpackCounts count members and attributes of layers as they were
// unpacked.
type UnpackCounts struct {
	// Devices are character and block device members, skipped (a task
	// gets its own /dev).
	Devices int
	// Xattrs are extended attributes dropped: not user.* or
	// security.capability, or not supported by the store's file system.
	Xattrs int
	// Whiteouts are the .wh.NAME members made into overlayfs whiteouts.
	Whiteouts int
	// OpaqueDirs are the directories marked opaque (.wh..wh..opq).
	OpaqueDirs int
}

func (c *UnpackCounts) add(o UnpackCounts) {
	c.Devices += o.Devices
	c.Xattrs += o.Xattrs
	c.Whiteouts += o.Whiteouts
	c.OpaqueDirs += o.OpaqueDirs
}
