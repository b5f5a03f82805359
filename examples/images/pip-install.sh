#!/usr/bin/env bash
# pip-install.sh installs the pure-Python project hello-demo into the
# system site-packages of the Debian image of the workspace demo-debian
# (offline: no index, no build isolation), suspends the workspace to its
# snapshot, resumes it, and checks that the package is still there: what a
# task changes in its image is the workspace's (docs/images.md). Run it
# after `kubectl apply -f examples/images/workspaces.yaml`; KUBECTL and
# PLUGIN name kubectl and kubectl-bashtask (default: the ones on the PATH).
# It exits non-zero when an outcome differs from the expected one.
set -euo pipefail
KUBECTL="${KUBECTL:-kubectl}"
PLUGIN="${PLUGIN:-kubectl-bashtask}"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
WS=demo-debian
run() { "${PLUGIN}" run --workspace "${WS}" -- "$1"; }
die() { printf 'pip-install.sh: error: %s\n' "$*" >&2; exit 1; }

echo "\$ kubectl bashtask cp examples/images/hello-demo ${WS}:hello-demo"
"${PLUGIN}" cp "${HERE}/hello-demo" "${WS}:hello-demo"

# Debian marks its python EXTERNALLY-MANAGED (PEP 668): the flag says the
# image is the task's to change. Not apt-get: it wants uid 0, which no
# task has.
echo '$ pip install --break-system-packages --no-index --no-build-isolation ./hello-demo'
run 'pip install -q --break-system-packages --no-index --no-build-isolation ./hello-demo && python3 -c "import hello_demo; print(hello_demo.__file__)"'

echo "\$ kubectl bashtask workspace suspend ${WS}; kubectl bashtask workspace resume ${WS}"
"${PLUGIN}" workspace suspend "${WS}" >/dev/null
echo "${WS}: $("${KUBECTL}" get bashworkspace "${WS}" -o jsonpath='{.status.phase}, a snapshot of {.status.snapshot.bytes} bytes')"
"${PLUGIN}" workspace resume "${WS}" >/dev/null
echo "${WS}: $("${KUBECTL}" get bashworkspace "${WS}" -o jsonpath='{.status.phase} on {.status.nodeName}, restored from its snapshot')"

echo '$ python3 -c "import hello_demo ..."; pip show hello-demo'
out=$(run 'python3 -c "import hello_demo; print(hello_demo.greet()); print(hello_demo.__file__)"
pip show hello-demo 2>/dev/null | grep -E "^(Name|Version|Location):"')
echo "${out}"
grep -q '^hello from a package installed before the suspend$' <<<"${out}" || die "hello_demo is not importable after the resume"
grep -Eq '^/usr/local/lib/python3[^/]*/dist-packages/hello_demo/__init__.py$' <<<"${out}" || die "hello_demo is not in /usr/local/lib/python3*/dist-packages"
grep -q '^Name: hello-demo$' <<<"${out}" || die "pip show does not list hello-demo after the resume"
