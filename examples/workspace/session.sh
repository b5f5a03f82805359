#!/usr/bin/env bash
# session.sh runs three commands of one session in the workspace
# demo-session, one after another, the way an agent platform does: each is
# its own BashTask, and each starts where the one before ended, with the
# files and the exported variables it left. Run it after
# `kubectl apply -f examples/workspace/workspace.yaml`; KUBECTL and PLUGIN
# name kubectl and kubectl-bashtask (default: the ones on the PATH).
set -euo pipefail
KUBECTL="${KUBECTL:-kubectl}"
PLUGIN="${PLUGIN:-kubectl-bashtask}"
run() { "${PLUGIN}" run --workspace demo-session --owner agent-7 -- "$1"; }

"${PLUGIN}" workspace get demo-session

echo '$ mkdir repo && cd repo && git init && commit notes.txt'
run 'git config --global user.email agent-7@example.com
mkdir -p repo && cd repo && git init -q -b main
echo "first note" > notes.txt && git add notes.txt && git commit -qm "first note"
export PROJECT=demo; echo "committed in $PWD as $(whoami)"'

echo '$ change notes.txt (in the carried directory, with the carried $PROJECT)'
run 'echo "second note, project $PROJECT" >> notes.txt && git commit -qam "second note" && pwd'

echo '$ git log'
run 'git log --format="%h %an <%ae> %s"'

"${PLUGIN}" workspace get demo-session
