#!/usr/bin/env bash
# mcp-clients.sh installs the MCP clients the end-to-end tests drive
# `kubectl bashtask mcp` with (test/e2e/mcpclients: the official TypeScript
# SDK and the MCP Inspector's CLI) from npm, at the versions of its
# package-lock.json, into test/e2e/mcpclients/node_modules (not committed),
# once: again only when the lock file changes. node and npm come from
# Debian when they are missing (root and apt-get needed).
set -euo pipefail

dir=$(cd "$(dirname "$0")/../test/e2e/mcpclients" && pwd)
if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
  if [[ $(id -u) != 0 ]] || ! command -v apt-get >/dev/null; then
    echo "mcp-clients: node and npm are missing; install them (Debian: nodejs npm)" >&2
    exit 1
  fi
  echo "mcp-clients: installing nodejs and npm from Debian" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends nodejs npm >/dev/null
fi
stamp=$dir/node_modules/.bashtask-lock.sha256
want=$(sha256sum "$dir/package-lock.json" | cut -d' ' -f1)
if [[ -f $stamp && $(cat "$stamp") == "$want" ]]; then
  exit 0
fi
echo "mcp-clients: npm ci in $dir" >&2
(cd "$dir" && npm ci --no-audit --no-fund --loglevel=error >/dev/null)
echo "$want" >"$stamp"
