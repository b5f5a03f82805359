#!/usr/bin/env bash
# demo.sh runs example tasks through the node executor (`bashtask-agent
# exec`), the code path the agent uses for every BashTask, and prints each
# result. It needs only Go and bash.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BIN="${ROOT}/bin/bashtask-agent"
WORK="$(mktemp -d "${TMPDIR:-/tmp}/bashtask-demo.XXXXXX")"
trap 'rm -rf "${WORK}"' EXIT

echo "demo: building bashtask-agent"
(cd "${ROOT}" && go build -o "${BIN}" ./cmd/bashtask-agent)

n=0
run() {
  local title="$1"; shift
  n=$((n + 1))
  printf '\n\033[1m%d. %s\033[0m\n$ bashtask-agent exec %s\n' "${n}" "${title}" "$*"
  "${BIN}" exec --spill-dir "${WORK}/spill-${n}" "$@" | pretty
}

# pretty indents the JSON result when python3 is there to do it.
pretty() {
  if command -v python3 >/dev/null; then python3 -m json.tool; else cat; echo; fi
}

run "Hello" -- 'echo "hello from $(uname -n)"'

LICENSE=/usr/share/common-licenses/GPL-3
[[ -r "${LICENSE}" ]] || LICENSE=/usr/share/common-licenses/Apache-2.0
run "Word frequencies of a licence text the OS ships" -- \
  "tr -cs 'A-Za-z' '\\n' < ${LICENSE} | tr 'A-Z' 'a-z' | sort | uniq -c | sort -rn | head -5"

printf '{"user":"ada","langs":["go","c"]}' > "${WORK}/payload.json"
run "A JSON payload on stdin, transformed" --stdin-file "${WORK}/payload.json" -- \
  "sed -e 's/\"user\"/\"name\"/' -e 's/}\$/,\"seen\":true}/'"

# The agent's own DEMO_API_KEY is scrubbed; an explicit task entry is passed.
DEMO_API_KEY=agent-secret run "Credential scrub: the agent's DEMO_API_KEY is not visible, an explicit entry is" \
  --env GITHUB_TOKEN=given-by-the-task -- \
  'echo "DEMO_API_KEY=${DEMO_API_KEY:-<unset>} GITHUB_TOKEN=${GITHUB_TOKEN} TERM=${TERM}"'

run "A failing command" -- 'echo "about to fail" >&2; exit 3'

run "A timeout that also kills the command's children" --timeout 1s --grace 1s -- \
  'sleep 300 & (sleep 300 &); echo started; sleep 300'

run "2 MB of output: a 300-byte tail, the complete stream in the spill file" --tail-bytes 300 -- \
  'seq -f "line-%07g" 1 166667'
spill="${WORK}/spill-${n}"
echo "spill file checksum (compare with sha256 above):"
find "${spill}" -type f -name 'stdout*' -exec sha256sum {} \;
