#!/usr/bin/env bash
# demo.sh is `make demo`: it builds what it needs, starts a local cluster
# (bashtask-local: kube-apiserver, etcd, the controller and two agents),
# applies every manifest in examples/, cancels the long-running one, waits
# for all to finish, prints what happened, reads the 2 MB output through
# the output API and checks its SHA-256 against the status, runs a command
# that prints a line a second and shows when each line arrives, runs a
# session in a workspace, and, as root (images need the tenant level),
# runs one command in workspaces of two images from a local registry and
# keeps a pip-installed package across a suspend and a resume
# (examples/images), calls a private HTTPS service with a token the task
# never sees and is refused a name its egress policy does not allow
# (examples/egress), then shuts the cluster down. It fails when a task
# ends differently from its bashtask.dev/expect-reason annotation, or an
# outcome differs from the one it checks.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "${ROOT}"
DIR=".bashtask/demo"
KUBECTL="${ROOT}/bin/k8s/kubectl"
PLUGIN="${ROOT}/bin/kubectl-bashtask"

say() { printf '\n\033[1m== %s\033[0m\n' "$*"; }
die() { printf 'demo: error: %s\n' "$*" >&2; exit 1; }

say "Building the binaries and the control plane (the first time takes several minutes)"
# Side by side: the project's binaries compile while the control plane's
# modules download and its links run on one core.
make -s binaries &
build=$!
hack/setup-envtest.sh >/dev/null || { wait "${build}" || true; die "building the control plane failed"; }
wait "${build}" || die "building the binaries failed"

mkdir -p "${DIR}"
# Images need the tenant level, which needs root: the task images (and the
# registry that serves them) only then. The Debian one is built by
# debootstrap the first time (minutes), then taken from bin/images/cache.
# What they are made of comes from Debian when missing: bash-static and
# busybox-static (task-small), debootstrap (task, when not cached).
images=()
wait_up=1200
no_images=""
if [[ "$(id -u)" == 0 ]]; then
  hack/test-packages.sh
  if [[ -z "$(compgen -G 'bin/images/cache/task-rootfs-*.tar.gz')" ]]; then
    if ! command -v debootstrap >/dev/null && command -v apt-get >/dev/null; then
      echo "demo: installing debootstrap from Debian" >&2
      DEBIAN_FRONTEND=noninteractive apt-get update -qq
      DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends debootstrap >/dev/null
    fi
    command -v debootstrap >/dev/null || no_images="debootstrap is missing (apt-get install debootstrap)"
  fi
  [[ -x /bin/bash-static && -x /bin/busybox ]] || no_images="bash-static or busybox-static is missing"
  if [[ -z "${no_images}" ]]; then
    images=(--registry --registry-image task-small,task)
    wait_up=9000 # a cold build of task (or of a changed package list) takes minutes
  fi
else
  no_images="not root: the agents run at the process level, which has no images"
fi
# Egress by name (examples/egress) needs the tenant level too: a private
# HTTPS service in a network namespace of its own (hack/demo-upstream),
# whose resolver the agents forward the workspaces' allowed names to.
egress=()
upstream=""
if [[ "$(id -u)" == 0 ]]; then
  go build -o bin/demo-upstream ./hack/demo-upstream
  (umask 077 && head -c 24 /dev/urandom | base64 | tr -d '/+=' >"${DIR}/api-token")
  bin/demo-upstream --token-file "${DIR}/api-token" --ca-file "${DIR}/upstream-ca.pem" >"${DIR}/upstream.log" 2>&1 &
  upstream=$!
  for _ in $(seq 100); do
    grep -q "upstream is up" "${DIR}/upstream.log" && break
    kill -0 "${upstream}" 2>/dev/null || break
    sleep 0.1
  done
  resolver=$(sed -n 's/^upstream is up: resolver \([0-9.]*\),.*/\1/p' "${DIR}/upstream.log")
  [[ -n "${resolver}" ]] || { cat "${DIR}/upstream.log" >&2; die "hack/demo-upstream did not come up"; }
  egress=(--agent-arg=--egress-resolver="${resolver}")
fi
bin/bashtask-local up --dir "${DIR}" --agents 2 --agent-env DEMO_API_KEY=agent-only-secret "${images[@]}" "${egress[@]}" >"${DIR}/launcher.log" 2>&1 &
launcher=$!
cleanup() {
  say "Stopping the local cluster"
  kill -TERM "${launcher}" 2>/dev/null || true
  wait "${launcher}" 2>/dev/null || true
  if [[ -n "${upstream}" ]]; then
    kill -TERM "${upstream}" 2>/dev/null || true
    wait "${upstream}" 2>/dev/null || true
  fi
}
trap cleanup EXIT

if ((${#images[@]})); then
  say "Starting the local cluster with a registry of the task images task-small and task"
  echo "(the first time, debootstrap builds the task image: a minute or more)"
else
  say "Starting the local cluster"
fi
for _ in $(seq "${wait_up}"); do
  grep -q "is up" "${DIR}/launcher.log" && break
  kill -0 "${launcher}" 2>/dev/null || { cat "${DIR}/launcher.log" >&2; die "bashtask-local exited"; }
  sleep 0.1
done
grep -q "is up" "${DIR}/launcher.log" || { cat "${DIR}/launcher.log" >&2; die "bashtask-local did not come up in $((wait_up / 10)) s"; }
sed -n '/is up/,$p' "${DIR}/launcher.log"
export KUBECONFIG="${ROOT}/${DIR}/kubeconfig"

say "kubectl apply -f examples/"
"${KUBECTL}" apply -f examples/

say "Cancelling long-running once it runs"
for _ in $(seq 300); do
  [[ "$("${KUBECTL}" get bt long-running -o jsonpath='{.status.phase}')" == Running ]] && break
  sleep 0.1
done
"${PLUGIN}" cancel long-running

say "Waiting for every task to finish"
names=$("${KUBECTL}" get bt -o jsonpath='{range .items[*]}{.metadata.name}{"\n"}{end}')
pending() { "${KUBECTL}" get bt -o jsonpath='{range .items[*]}{.status.reason}{"\n"}{end}' | grep -c '^$' || true; }
for _ in $(seq 1200); do
  [[ "$(pending)" == 0 ]] && break
  sleep 0.1
done
[[ "$(pending)" == 0 ]] || { "${KUBECTL}" get bt >&2; die "tasks still unfinished after 120 s"; }

say "Tasks"
"${PLUGIN}" get

say "Output tails"
for n in ${names}; do
  if [[ "$("${KUBECTL}" get bt "${n}" -o jsonpath='{.status.stdout.truncated}')" == true ]]; then
    printf -- '--- %s (stdout, truncated: the last lines of the tail)\n' "${n}"
    "${KUBECTL}" get bt "${n}" -o jsonpath='{.status.stdout.tail}' | tail -n 4
  else
    printf -- '--- %s (stdout)\n' "${n}"
    "${KUBECTL}" get bt "${n}" -o jsonpath='{.status.stdout.tail}' | head -n 10
  fi
  err=$("${KUBECTL}" get bt "${n}" -o jsonpath='{.status.stderr.tail}')
  [[ -n "${err}" ]] && printf -- '--- %s (stderr)\n%s\n' "${n}" "$(tail -n 3 <<<"${err}")"
done

say "kubectl get bt --field-selector spec.owner=batch-42"
"${KUBECTL}" get bt --field-selector spec.owner=batch-42

say "The full 2 MB stream of large-output, through the output API"
want=$("${KUBECTL}" get bt large-output -o jsonpath='{.status.stdout.sha256}')
total=$("${KUBECTL}" get bt large-output -o jsonpath='{.status.stdout.totalBytes}')
got=$("${PLUGIN}" logs --full large-output | sha256sum | cut -d' ' -f1)
bytes=$("${PLUGIN}" logs --full large-output | wc -c)
echo "status: ${total} bytes, sha256 ${want}"
echo "read:   ${bytes} bytes, sha256 ${got}"
[[ "${got}" == "${want}" && "${bytes}" == "${total}" ]] || die "the stream read does not match the status"

say "Checking outcomes against bashtask.dev/expect-reason"
failed=0
while read -r name expect reason; do
  if [[ "${expect}" == "${reason}" ]]; then
    printf '  ok    %-18s %s\n' "${name}" "${reason}"
  else
    printf '  FAIL  %-18s got %s, expected %s\n' "${name}" "${reason:-<none>}" "${expect}"
    failed=1
  fi
done < <("${KUBECTL}" get bt -o jsonpath='{range .items[*]}{.metadata.name}{" "}{.metadata.annotations.bashtask\.dev/expect-reason}{" "}{.status.reason}{"\n"}{end}')
[[ "${failed}" == 0 ]] || die "some examples ended differently from what they expect"
say "All examples ended as expected"

say "kubectl bashtask run of a line a second: each line as it is written"
start=${EPOCHREALTIME/./}
"${PLUGIN}" run --rm -- 'for i in 1 2 3 4 5 6; do echo "line $i"; sleep 1; done' |
  while IFS= read -r line; do
    now=${EPOCHREALTIME/./}
    printf '%6d ms  %s\n' $(((now - start) / 1000)) "${line}"
  done

say "A session: three tasks in one workspace, one after another (examples/workspace)"
"${KUBECTL}" apply -f examples/workspace/workspace.yaml
"${KUBECTL}" wait --for=jsonpath='{.status.phase}'=Ready bashworkspace/demo-session --timeout=60s
KUBECTL="${KUBECTL}" PLUGIN="${PLUGIN}" examples/workspace/session.sh || die "the session in demo-session failed"

say "A task of another owner naming demo-session is refused"
"${KUBECTL}" apply -f examples/workspace/intruder.yaml
for _ in $(seq 300); do
  [[ -n "$("${KUBECTL}" get bt intruder -o jsonpath='{.status.reason}')" ]] && break
  sleep 0.1
done
reason=$("${KUBECTL}" get bt intruder -o jsonpath='{.status.reason}')
echo "intruder: ${reason}: $("${KUBECTL}" get bt intruder -o jsonpath='{.status.message}')"
[[ "${reason}" == InvalidSpec ]] || die "the intruder ended ${reason:-<none>}, expected InvalidSpec"

say "A server in demo-session, fetched through kubectl bashtask port-forward (docs/portforward.md)"
srv=$("${PLUGIN}" run -w demo-session --owner agent-7 --detach --timeout 5m -- \
  'echo "hello from demo-session" > index.html && exec python3 -u -m http.server 8000 --bind 127.0.0.1' 2>/dev/null)
for _ in $(seq 300); do
  "${PLUGIN}" logs "${srv}" 2>/dev/null | grep -q 'Serving HTTP' && break
  sleep 0.1
done
"${PLUGIN}" port-forward demo-session 18080:8000 & pf=$!
for _ in $(seq 100); do curl -s -o /dev/null http://127.0.0.1:18080/ && break; sleep 0.1; done
echo "curl http://127.0.0.1:18080/index.html: $(curl -s http://127.0.0.1:18080/index.html)"
kill "${pf}"; wait "${pf}" 2>/dev/null || true
"${PLUGIN}" cancel "${srv}" >/dev/null

say "kubectl bashtask workspace delete demo-session"
"${PLUGIN}" workspace delete demo-session

if ((${#egress[@]})); then
  say "Egress by name, with a token the task never sees (examples/egress, docs/egress.md)"
  echo "$(sed -n 's/^upstream is up: //p' "${DIR}/upstream.log") (hack/demo-upstream, in a network namespace of its own)"
  "${KUBECTL}" create secret generic demo-api --from-file=token="${DIR}/api-token" >/dev/null
  "${KUBECTL}" create configmap demo-upstream-ca --from-file=ca.crt="${DIR}/upstream-ca.pem" >/dev/null
  "${KUBECTL}" apply -f examples/egress/workspace.yaml
  "${KUBECTL}" wait --for=jsonpath='{.status.phase}'=Ready bashworkspace/demo-egress --timeout=120s
  "${KUBECTL}" apply -f examples/egress/tasks.yaml
  for _ in $(seq 600); do
    [[ -n "$("${KUBECTL}" get bt call-api -o jsonpath='{.status.reason}')" && -n "$("${KUBECTL}" get bt denied-name -o jsonpath='{.status.reason}')" ]] && break
    sleep 0.1
  done
  api_out=$("${KUBECTL}" get bt call-api -o jsonpath='{.status.stdout.tail}')
  api_reason=$("${KUBECTL}" get bt call-api -o jsonpath='{.status.reason}')
  denied_err=$("${KUBECTL}" get bt denied-name -o jsonpath='{.status.stderr.tail}')
  denied_reason=$("${KUBECTL}" get bt denied-name -o jsonpath='{.status.reason}')
  printf -- '--- call-api (%s)\n%s\n--- denied-name (%s, stderr)\n%s\n' "${api_reason}" "${api_out}" "${denied_reason}" "${denied_err}"
  token=$(cat "${DIR}/api-token")
  [[ "${api_reason}" == Succeeded && "${api_out}" == *"200, the request carried the token"* ]] || die "call-api did not reach api.demo.test with the token"
  [[ "${api_out}" == *"> GET /hello"* && "${api_out}" != *"> Authorization"* && "${api_out}" != *"${token}"* ]] ||
    die "the request as call-api sent it holds the token, or curl printed no request"
  [[ "${denied_reason}" == NonZeroExit && "${denied_err}" == *"Could not resolve host: other.demo.test"* ]] ||
    die "denied-name did not fail on the name the policy refuses"
  "${PLUGIN}" workspace delete demo-egress
fi

if ((${#images[@]})); then
  say "Two workspaces of two images (examples/images), the same command in each"
  # The manifests name the registry at 127.0.0.1:5000; this one listens on
  # a free port.
  registry=$(sed -n 's|^  # image \([^/ ]*\)/bashtask/task-small:local .*|\1|p' "${DIR}/launcher.log")
  [[ -n "${registry}" ]] || die "bashtask-local printed no task-small image"
  sed "s|127.0.0.1:5000/|${registry}/|" examples/images/workspaces.yaml | "${KUBECTL}" apply -f -
  "${KUBECTL}" wait --for=jsonpath='{.status.phase}'=Ready bashworkspace/demo-small bashworkspace/demo-debian --timeout=300s
  "${KUBECTL}" get bashworkspace demo-small demo-debian -o custom-columns='NAME:.metadata.name,IMAGE:.status.image.requested,DIGEST:.status.image.digest' | cut -c1-110
  "${KUBECTL}" apply -f examples/images/which-system.yaml
  "${KUBECTL}" wait --for=jsonpath='{.status.phase}'=Succeeded bt/which-system-small bt/which-system-debian --timeout=120s >/dev/null ||
    { "${PLUGIN}" get >&2; die "the tasks of examples/images/which-system.yaml did not succeed"; }
  small=$("${KUBECTL}" get bt which-system-small -o jsonpath='{.status.stdout.tail}')
  debian=$("${KUBECTL}" get bt which-system-debian -o jsonpath='{.status.stdout.tail}')
  printf -- '--- which-system-small (task-small)\n%s\n--- which-system-debian (task)\n%s\n' "${small}" "${debian}"
  [[ "${small}" == *"no /etc/os-release"* && "${small}" == *"no python3"* ]] || die "task-small has an os-release or a python3"
  [[ "${debian}" == *'PRETTY_NAME="Debian GNU/Linux 12 (bookworm)"'* && "${debian}" == *"Python 3."* ]] || die "task is not Debian bookworm with python3"

  say "A package pip installs into the task image survives suspend and resume (examples/images/pip-install.sh)"
  KUBECTL="${KUBECTL}" PLUGIN="${PLUGIN}" examples/images/pip-install.sh || die "the package did not survive the suspend"
  "${PLUGIN}" workspace delete demo-small demo-debian
else
  say "Skipping examples/images: ${no_images}"
fi
