#!/usr/bin/env bash
# apt-get install ARGS (packages and apt-get options) as root, one install at a time on this machine.
# scripts/test.sh installs Chromium and Prometheus while tests/slurm/build.sh installs Slurm's build
# dependencies in the background, and an apt-get that finds the dpkg lock taken fails at once: on a fresh
# machine that left 25.11 unbuilt until its tests built it again. So: wait for our own installs (a lock on
# /var/lock/cocaq-apt.lock), then for anyone else's (apt's DPkg::Lock::Timeout); if the install fails,
# refresh the package lists (a fresh machine may have none or stale ones) and try once more.
set -euo pipefail
mkdir -p /var/lock
lock=(flock --close -w 1800 /var/lock/cocaq-apt.lock) # --close: no daemon a package starts keeps the lock
apt=(apt-get -q -y -o DPkg::Lock::Timeout=900)
export DEBIAN_FRONTEND=noninteractive
if ! "${lock[@]}" "${apt[@]}" install "$@" >/dev/null; then
    echo "apt-install: apt-get install $* failed; apt-get update and retry" >&2
    "${lock[@]}" "${apt[@]}" update >/dev/null || true
    "${lock[@]}" "${apt[@]}" install "$@" >/dev/null
fi
