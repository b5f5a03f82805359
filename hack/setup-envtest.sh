#!/usr/bin/env bash
# setup-envtest.sh builds the control-plane binaries that envtest, the e2e
# suite and bashtask-local run against: kube-apiserver and etcd, from the Go
# module proxy, into bin/k8s/, with a kubectl of the same release for the
# demo and for users of the local cluster.
#
# kube-apiserver comes from k8s.io/kubernetes at the release that matches the
# k8s.io/* libraries in go.mod (v0.X.Y -> v1.X.Y). k8s.io/kubernetes requires
# its staging modules at v0.0.0 with local replace directives, which do not
# travel through the proxy, so a throw-away wrapper module maps each one to the
# published k8s.io/* module of the same release. etcd is built the same way
# from go.etcd.io/etcd/server/v3 at the version k8s.io/kubernetes itself
# requires, with every sibling etcd module pinned to that version.
#
# The real release versions are stamped through -ldflags so clients see
# v1.X.Y, not v0.0.0-master. Nothing happens when bin/k8s/ already holds
# binaries built for the same versions and Go toolchain.
#
# With --node it also builds the node components of the one-node cluster
# (hack/cluster.sh): kubelet, kube-controller-manager, kube-scheduler and
# kube-proxy of the same release, the same way, with a stamp of their own.
#
# Usage: hack/setup-envtest.sh            build if needed, print the directory
#        hack/setup-envtest.sh --node     also the node components
#        hack/setup-envtest.sh --print    only print the directory (no build)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="${ROOT}/bin/k8s"
GO="${GO:-go}"

log() { printf 'setup-envtest: %s\n' "$*" >&2; }
die() { printf 'setup-envtest: error: %s\n' "$*" >&2; exit 1; }

NODE=0
case "${1:-}" in
  --print) echo "${OUT}"; exit 0 ;;
  --node) NODE=1 ;;
  "") ;;
  *) die "unknown argument '${1}' (want --node or --print)" ;;
esac
# The node components, built only with --node.
NODE_CMDS=(kubelet kube-controller-manager kube-scheduler kube-proxy)

command -v "${GO}" >/dev/null || die "the Go toolchain ('${GO}') is not on PATH"

cd "${ROOT}"
LIB_VERSION="$("${GO}" list -m -f '{{.Version}}' k8s.io/apimachinery)" \
  || die "cannot read the k8s.io/apimachinery version from go.mod"
[[ "${LIB_VERSION}" =~ ^v0\.([0-9]+)\.([0-9]+)$ ]] \
  || die "k8s.io/apimachinery is at '${LIB_VERSION}', expected a release v0.MINOR.PATCH"
K8S_MINOR="${BASH_REMATCH[1]}"
K8S_VERSION="v1.${K8S_MINOR}.${BASH_REMATCH[2]}"
GO_VERSION="$("${GO}" env GOVERSION)"

STAMP="${OUT}/.versions"
NODE_STAMP="${OUT}/.node-versions"
WANT="kubernetes=${K8S_VERSION} go=${GO_VERSION}"
current() { # current STAMP BINARY...: the binaries exist and STAMP names this release and toolchain
  local stamp="$1"; shift
  for b in "$@"; do [[ -x "${OUT}/${b}" ]] || return 1; done
  [[ -f "${stamp}" ]] && grep -qx "${WANT}" "${stamp}"
}
CONTROL_PLANE_CURRENT=0
current "${STAMP}" kube-apiserver kubectl etcd && CONTROL_PLANE_CURRENT=1
NODE_CURRENT=1
if (( NODE )) && ! current "${NODE_STAMP}" "${NODE_CMDS[@]}"; then NODE_CURRENT=0; fi
if (( CONTROL_PLANE_CURRENT && NODE_CURRENT )); then
  log "kubernetes ${K8S_VERSION} binaries already in ${OUT}; nothing to do"
  echo "${OUT}"
  exit 0
fi

WORK="$(mktemp -d "${TMPDIR:-/tmp}/bashtask-envtest.XXXXXX")"
trap 'rm -rf "${WORK}"' EXIT
mkdir -p "${OUT}" "${WORK}/kube" "${WORK}/etcd"

log "resolving k8s.io/kubernetes@${K8S_VERSION} from the module proxy"
KMOD="$(cd "${WORK}" && "${GO}" mod download -json "k8s.io/kubernetes@${K8S_VERSION}" | sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",$/\1/p')"
[[ -n "${KMOD}" && -f "${KMOD}" ]] || die "could not download k8s.io/kubernetes@${K8S_VERSION}"

# Staging modules are the k8s.io/* requirements at the placeholder v0.0.0.
mapfile -t STAGING < <(awk '$1 ~ /^k8s\.io\// && $2 == "v0.0.0" {print $1}' "${KMOD}" | sort -u)
(( ${#STAGING[@]} > 0 )) || die "found no staging modules in ${KMOD}"
ETCD_VERSION="$(awk '$1 == "go.etcd.io/etcd/server/v3" {print $2; exit}' "${KMOD}")"
[[ -n "${ETCD_VERSION}" ]] || die "k8s.io/kubernetes@${K8S_VERSION} names no go.etcd.io/etcd/server/v3 version"

{
  echo "module bashtask.dev/envtest-kube"
  echo
  echo "go 1.26"
  echo
  echo "require k8s.io/kubernetes ${K8S_VERSION}"
  echo
  for m in "${STAGING[@]}"; do echo "replace ${m} => ${m} ${LIB_VERSION}"; done
} > "${WORK}/kube/go.mod"
{
  printf 'package tools\n\nimport (\n\t_ "k8s.io/kubernetes/cmd/kube-apiserver"\n\t_ "k8s.io/kubernetes/cmd/kubectl"\n'
  if (( NODE )); then for c in "${NODE_CMDS[@]}"; do printf '\t_ "k8s.io/kubernetes/cmd/%s"\n' "${c}"; done; fi
  printf ')\n'
} > "${WORK}/kube/tools.go"

VPKG="k8s.io/component-base/version"
BUILD_DATE="$(date -u +%Y-%m-%dT%H:%M:%SZ)"
KUBE_LDFLAGS="-s -w -X ${VPKG}.gitVersion=${K8S_VERSION} -X ${VPKG}.gitMajor=1 -X ${VPKG}.gitMinor=${K8S_MINOR} -X ${VPKG}.gitTreeState=clean -X ${VPKG}.buildDate=${BUILD_DATE}"

(
  cd "${WORK}/kube"
  "${GO}" mod tidy >"${WORK}/kube.log" 2>&1 || { cat "${WORK}/kube.log" >&2; exit 1; }
) || die "resolving the modules of k8s.io/kubernetes@${K8S_VERSION} failed (see the output above)"

if (( NODE && ! NODE_CURRENT )); then
  # Static like the release builds (no cgo): these run on the host only,
  # but a static binary does not depend on the host's C library.
  log "building ${NODE_CMDS[*]} ${K8S_VERSION}; the first build takes several minutes"
  for c in "${NODE_CMDS[@]}"; do
    (cd "${WORK}/kube" && CGO_ENABLED=0 "${GO}" build -trimpath -ldflags "${KUBE_LDFLAGS}" -o "${OUT}/${c}.new" "k8s.io/kubernetes/cmd/${c}") \
      || die "building ${c} ${K8S_VERSION} failed (see the output above)"
  done
  for c in "${NODE_CMDS[@]}"; do mv -f "${OUT}/${c}.new" "${OUT}/${c}"; done
  echo "${WANT}" > "${NODE_STAMP}"
  log "installed ${NODE_CMDS[*]} ${K8S_VERSION} into ${OUT}"
fi
if (( CONTROL_PLANE_CURRENT )); then
  echo "${OUT}"
  exit 0
fi

# etcd builds beside kube-apiserver: its module resolution waits on the
# network, and each link runs on one core while the other compiles.
build_etcd() {
  log "building etcd ${ETCD_VERSION}"
  {
    echo "module bashtask.dev/envtest-etcd"
    echo
    echo "go 1.26"
    echo
    echo "require go.etcd.io/etcd/server/v3 ${ETCD_VERSION}"
    echo
    for m in api/v3 client/pkg/v3 client/v3 pkg/v3 server/v3; do
      echo "replace go.etcd.io/etcd/${m} => go.etcd.io/etcd/${m} ${ETCD_VERSION}"
    done
  } > "${WORK}/etcd/go.mod"
  printf 'package tools\n\nimport _ "go.etcd.io/etcd/server/v3"\n' > "${WORK}/etcd/tools.go"
  cd "${WORK}/etcd"
  "${GO}" mod tidy >"${WORK}/etcd.log" 2>&1 || { cat "${WORK}/etcd.log" >&2; exit 1; }
  CGO_ENABLED=0 "${GO}" build -trimpath -ldflags "-s -w" -o "${OUT}/etcd.new" go.etcd.io/etcd/server/v3
}
( build_etcd ) &
etcd_pid=$!

log "building kube-apiserver and kubectl ${K8S_VERSION} (${#STAGING[@]} staging modules mapped to ${LIB_VERSION}); the first build takes several minutes"
(
  cd "${WORK}/kube"
  CGO_ENABLED=0 "${GO}" build -trimpath -ldflags "${KUBE_LDFLAGS}" -o "${OUT}/kube-apiserver.new" k8s.io/kubernetes/cmd/kube-apiserver
  # kubectl reads its version from client-go's copy of the version package.
  CGO_ENABLED=0 "${GO}" build -trimpath -ldflags "${KUBE_LDFLAGS} ${KUBE_LDFLAGS//k8s.io\/component-base\/version/k8s.io\/client-go\/pkg\/version}" -o "${OUT}/kubectl.new" k8s.io/kubernetes/cmd/kubectl
) || { wait "${etcd_pid}" || true; die "building kube-apiserver and kubectl ${K8S_VERSION} failed (see the output above)"; }
wait "${etcd_pid}" || die "building etcd ${ETCD_VERSION} failed (see the output above)"

mv -f "${OUT}/kube-apiserver.new" "${OUT}/kube-apiserver"
mv -f "${OUT}/kubectl.new" "${OUT}/kubectl"
mv -f "${OUT}/etcd.new" "${OUT}/etcd"
echo "${WANT}" > "${STAMP}"
echo "etcd=${ETCD_VERSION}" >> "${STAMP}"
log "installed $("${OUT}/kube-apiserver" --version) and etcd ${ETCD_VERSION} into ${OUT}"
echo "${OUT}"
