#!/usr/bin/env bash
# cluster.sh up|down: a one-node Kubernetes cluster on this machine with the
# operator installed from its Helm chart (`make cluster-up`,
# `make cluster-down`).
#
# up:   installs the node's Debian packages when missing (containerd, runc,
#       CNI plugins, nftables, iptables, conntrack, debootstrap), builds
#       kubelet and the other node binaries (hack/setup-envtest.sh --node),
#       helm and the project's binaries (kubectl-bashtask), then runs
#       hack/cluster: it builds the images, starts etcd,
#       kube-apiserver, containerd, kube-controller-manager, kube-scheduler,
#       kubelet and kube-proxy, waits for the Node to be Ready, installs the
#       chart (INSTALL=0 skips it) and prints the KUBECONFIG to use.
# down: stops every process and undoes what they changed on the host.
#
# Needs root. State and logs: .bashtask/cluster (CLUSTER_DIR).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "${ROOT}"
DIR="${CLUSTER_DIR:-.bashtask/cluster}"
TAG="${IMG_TAG:-$(git describe --tags --always --dirty 2>/dev/null || echo dev)}"

die() { printf 'cluster: error: %s\n' "$*" >&2; exit 1; }

case "${1:-}" in
  up)
    [[ "$(id -u)" == 0 ]] || die "a node (kubelet, containerd, nftables) needs root"
    hack/node-packages.sh
    hack/setup-envtest.sh --node >/dev/null
    make -s tools >/dev/null
    # kubectl-bashtask (and the other binaries) for the PATH up prints.
    go build -o bin/ ./cmd/...
    install=true
    [[ "${INSTALL:-1}" == 0 ]] && install=false
    exec go run ./hack/cluster up --dir "${DIR}" --tag "${TAG}" --install="${install}"
    ;;
  down)
    exec go run ./hack/cluster down --dir "${DIR}"
    ;;
  *)
    die "usage: hack/cluster.sh up|down"
    ;;
esac
