#!/usr/bin/env bash
# Builds the kernel base image offline: a minimal Debian with python3, made with debootstrap
# from the Debian mirror this machine's own apt sources name, then `docker import`ed.
# Used where no container registry is reachable (the usual case on kernelbox's CI machines).
#
# usage: images/bootstrap-base.sh [IMAGE]   (default kernelbox/base:bookworm)
set -euo pipefail

image="${1:-kernelbox/base:bookworm}"
suite="${KERNELBOX_SUITE:-bookworm}"

if docker image inspect "$image" >/dev/null 2>&1; then
  echo "base image $image already present"
  exit 0
fi

# The mirror comes from the machine's apt configuration, never from this repository.
mirror="${KERNELBOX_DEBIAN_MIRROR:-}"
if [ -z "$mirror" ]; then
  mirror=$(cat /etc/apt/sources.list.d/*.sources /etc/apt/sources.list 2>/dev/null \
    | grep -Eo '^(URIs:|deb)[[:space:]]+(\[[^]]*\][[:space:]]+)?https?://[^[:space:]]*debian/?' \
    | grep -v security | head -n1 | awk '{print $NF}' || true)
fi
if [ -z "$mirror" ]; then
  echo "error: no Debian mirror found in /etc/apt/sources.list(.d); set KERNELBOX_DEBIAN_MIRROR" >&2
  exit 1
fi

if ! command -v debootstrap >/dev/null 2>&1; then
  echo "installing debootstrap"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q debootstrap >/dev/null 2>&1 || {
    apt-get update -q >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q debootstrap >/dev/null
  }
fi

rootfs=$(mktemp -d /tmp/kernelbox-rootfs.XXXXXX)
trap 'rm -rf "$rootfs"' EXIT
echo "debootstrap $suite from $mirror (about a minute)"
debootstrap --variant=minbase --include=python3 "$suite" "$rootfs" "$mirror" \
  | sed -u 's/^/  /' | grep -E '^  I: (Retrieving|Validating|Extracting|Installing|Configuring|Base system)' \
  | awk 'NR % 20 == 1 || /Base system/' || true
test -x "$rootfs/usr/bin/python3" || { echo "error: debootstrap produced no python3" >&2; exit 1; }
# Keep the image small: apt lists and caches are of no use inside a kernel.
rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
echo "importing $image"
tar -C "$rootfs" -c . | docker import -c 'CMD ["python3"]' - "$image" >/dev/null
echo "base image $image built"
