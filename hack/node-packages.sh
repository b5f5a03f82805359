#!/usr/bin/env bash
# node-packages.sh installs from Debian what a one-node cluster needs on the
# host, when it is missing: the container runtime (containerd, runc), the
# CNI plugins, nftables and iptables (kube-proxy and kubelet), conntrack,
# iproute2, and debootstrap for the agent image's root file system.
set -euo pipefail

need=()
have() { command -v "$1" >/dev/null 2>&1 || [[ -x "/usr/sbin/$1" || -x "/sbin/$1" ]]; }
have containerd || need+=(containerd)
have runc || need+=(runc)
[[ -x /usr/lib/cni/bridge ]] || need+=(containernetworking-plugins)
have nft || need+=(nftables)
have iptables || need+=(iptables)
have conntrack || need+=(conntrack)
have ip || need+=(iproute2)
have debootstrap || need+=(debootstrap)
if ((${#need[@]})); then
  echo "node-packages: installing ${need[*]} from Debian" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
