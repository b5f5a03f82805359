#!/usr/bin/env bash
# setup-s3.sh builds versitygw, an S3-compatible server, from the Go module
# proxy into bin/versitygw. Tests that need a real S3 endpoint run it with its
# posix backend on a loopback address and credentials generated per run.
#
# The version is pinned here; nothing happens when bin/ already holds a
# versitygw built for the same version and Go toolchain.
#
# Usage: hack/setup-s3.sh            build if needed, print the binary's path
#        hack/setup-s3.sh --print    only print the path (no build)
set -euo pipefail

VERSITYGW_VERSION="${VERSITYGW_VERSION:-v1.8.0}"

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="${ROOT}/bin"
BIN="${OUT}/versitygw"
GO="${GO:-go}"

log() { printf 'setup-s3: %s\n' "$*" >&2; }
die() { printf 'setup-s3: error: %s\n' "$*" >&2; exit 1; }

if [[ "${1:-}" == "--print" ]]; then
  echo "${BIN}"
  exit 0
fi

command -v "${GO}" >/dev/null || die "the Go toolchain ('${GO}') is not on PATH"

GO_VERSION="$("${GO}" env GOVERSION)"
STAMP="${OUT}/.versitygw-version"
if [[ -x "${BIN}" && -f "${STAMP}" ]] \
   && grep -qx "versitygw=${VERSITYGW_VERSION} go=${GO_VERSION}" "${STAMP}"; then
  log "versitygw ${VERSITYGW_VERSION} already in ${OUT}; nothing to do"
  echo "${BIN}"
  exit 0
fi

mkdir -p "${OUT}"
WORK="$(mktemp -d "${TMPDIR:-/tmp}/bashtask-s3.XXXXXX")"
trap 'rm -rf "${WORK}"' EXIT

# `go install pkg@version` builds in module mode with the module's own
# go.mod, outside this repository's module, so versitygw's dependencies do not
# touch ours. GOFLAGS is cleared so a workspace setting cannot interfere.
log "building github.com/versity/versitygw@${VERSITYGW_VERSION} from the module proxy"
GOFLAGS=-buildvcs=false GOBIN="${WORK}" CGO_ENABLED=0 \
  "${GO}" install -trimpath -ldflags "-s -w" \
  "github.com/versity/versitygw/cmd/versitygw@${VERSITYGW_VERSION}" \
  || die "building versitygw ${VERSITYGW_VERSION} failed"
mv -f "${WORK}/versitygw" "${BIN}"
echo "versitygw=${VERSITYGW_VERSION} go=${GO_VERSION}" > "${STAMP}"
log "built ${BIN}"
echo "${BIN}"
