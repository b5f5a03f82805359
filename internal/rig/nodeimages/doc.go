// Package nodeimages builds the project's container images without a
// container engine or a registry: the controller, the agent and a pod
// sandbox (pause) image, each written as a docker-archive tar file that
// `ctr -n k8s.io images import` loads under its reference. The images match
// the Dockerfile's targets (same binaries, user, entrypoint and labels); the
// agent's Debian root file system is made with debootstrap and cached, so
// only the first build needs the Debian mirror.
//
// Images are built for the architecture of the machine running Build (the
// node that imports them), and the agent image needs root and debootstrap
// when its root file system is not cached yet.
package nodeimages
