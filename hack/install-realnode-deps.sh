#!/usr/bin/env bash
# The Debian packages the real-node tier needs (tests/realnode, `nodegate dev images`), installed only
# when a tool is missing: a machine that has them all does nothing, not even `apt-get update`.
#
#   hack/install-realnode-deps.sh           # install what is missing (needs root and apt)
#   hack/install-realnode-deps.sh --check   # list what is missing; exit 1 if anything is
#
# What each is for:
#   buildah      builds the images from their Dockerfiles (gate/devcluster/buildah.py, images.py)
#   debootstrap  makes the Debian roots: image bases and node roots (gate/devcluster/rootfs.py)
#   containerd, runc, conntrack, iptables   run the real nodes' pods
#   skopeo, umoci                           inspect and unpack images by hand (docs/images.md)
# Debian is the only distribution archive reachable from this machine kind; these are all in bookworm.
set -euo pipefail

# tool on PATH -> the Debian package that provides it
TOOLS=(
  "buildah:buildah"
  "debootstrap:debootstrap"
  "containerd:containerd"
  "runc:runc"
  "conntrack:conntrack"
  "iptables:iptables"
  "skopeo:skopeo"
  "umoci:umoci"
)

missing=()
for entry in "${TOOLS[@]}"; do
  tool=${entry%%:*}
  package=${entry#*:}
  if ! PATH="$PATH:/usr/sbin:/sbin" command -v "$tool" >/dev/null 2>&1; then
    missing+=("$package")
  fi
done

if [[ ${#missing[@]} -eq 0 ]]; then
  exit 0
fi
if [[ ${1:-} == --check ]]; then
  echo "missing Debian packages for the real-node tier: ${missing[*]}"
  exit 1
fi
if [[ $(id -u) -ne 0 ]]; then
  echo "the real-node tier needs ${missing[*]}; run this script as root (it uses apt-get)" >&2
  exit 1
fi
if ! command -v apt-get >/dev/null 2>&1; then
  echo "the real-node tier needs ${missing[*]} and this machine has no apt-get; install them yourself" >&2
  exit 1
fi
echo "Installing ${missing[*]} from Debian for the real-node tier ..." >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -q
apt-get install -y -q --no-install-recommends "${missing[@]}"
