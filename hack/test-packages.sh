#!/usr/bin/env bash
# test-packages.sh installs from Debian what the unit tests build their
# test images from, when it is missing: bash-static (/bin/bash-static) and
# busybox-static (/bin/busybox), statically linked, so that a layer holding
# them runs without the node's libraries (executor/root_linux_test.go);
# and the programs the terminal tests drive (executor/terminal_linux_test.go,
# test/e2e/attach_test.go; docs/terminal.md): tmux, the real terminal, and
# vim, top (procps), tput (ncurses-bin), git and perl inside it.
# Without root or apt-get it says what is missing and leaves the tests to
# skip (or fail under BASHTASK_STRICT=1).
set -euo pipefail

need=()
[[ -x /bin/bash-static ]] || need+=(bash-static)
[[ -x /bin/busybox ]] || need+=(busybox-static)
for pair in tmux:tmux vim:vim top:procps tput:ncurses-bin git:git perl:perl; do
  command -v "${pair%%:*}" >/dev/null || need+=("${pair#*:}")
done
((${#need[@]})) || exit 0
if [[ $(id -u) != 0 ]] || ! command -v apt-get >/dev/null; then
  echo "test-packages: ${need[*]} missing; install them (Debian) for the image root and terminal tests" >&2
  exit 0
fi
echo "test-packages: installing ${need[*]} from Debian" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
