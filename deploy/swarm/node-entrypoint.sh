#!/bin/sh
# Starts the inner Docker engine of a Swarm test node (deploy/swarm/test.sh).
# The container runs with every capability but CAP_SYS_RESOURCE, no seccomp filter and
# writable /proc and /sys, so cgroup mounts are read-only bind mounts: remount each one
# read-write (a plain `remount,rw` is refused; `remount,bind,rw` is not).
set -eu
for m in $(awk '$3 == "cgroup" || $3 == "cgroup2" { print $2 }' /proc/self/mounts); do
  mount -o remount,bind,rw "$m" 2>/dev/null || true
done
mount -o remount,rw /sys/fs/cgroup 2>/dev/null || true
# A container restarted after `docker kill` keeps the old pid file.
rm -f /var/run/docker.pid /run/docker.pid
# The agent and its kernels meet on file sockets in this directory (same path in both).
mkdir -p /run/kernelbox
exec dockerd -H unix:///var/run/docker.sock -H tcp://0.0.0.0:2375 \
  --bip "${KBSWARM_BIP:-10.214.1.1/24}" --mtu 1350 --dns "${KBSWARM_DNS:-1.1.1.1}" \
  --default-address-pool base=10.216.0.0/16,size=24 "$@"
