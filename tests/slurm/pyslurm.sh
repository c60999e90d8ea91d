#!/usr/bin/env bash
# Install pyslurm (PyPI's 25.11 release, built from its source) into a virtual environment, against the
# Slurm 25.11 that tests/slurm/build.sh installed. Cached: does nothing when that venv already imports a
# pyslurm built for this Slurm. The same recipe works for a site (README: "Slurm and pyslurm").
#
#   tests/slurm/pyslurm.sh [VENV]     # default: the repository's .venv
#
# Exit 3 (one line on stderr) when Slurm 25.11's source is not there (see build.sh).
set -euo pipefail
export LC_ALL=C.UTF-8

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
VENV=${1:-$repo/.venv}
PY=$VENV/bin/python

log() { printf '[pyslurm.sh %s] %s\n' "$(date +%T)" "$*" >&2; }

# one at a time: scripts/test.sh starts this in the background and the tests call it again to wait
mkdir -p /var/lock
exec 9>/var/lock/cocaq-pyslurm.lock
flock 9

prefix=$("$here/build.sh") # builds Slurm first if needed; exit 3 without its source
# pyslurm's release follows Slurm's major.minor: take them from the headers it is compiled against
# (slurm_version.h's SLURM_VERSION_NUMBER, 0xMMmmuu), not from a program's output
header=$prefix/include/slurm/slurm_version.h
num=$(sed -n 's/^#define SLURM_VERSION_NUMBER \(0x[0-9a-fA-F]\{6\}\)$/\1/p' "$header" 2>/dev/null || true)
[[ -n $num ]] || { echo "pyslurm.sh: no SLURM_VERSION_NUMBER in $header: is $prefix a Slurm build?" >&2; exit 1; }
major=$(((num >> 16) & 0xff)).$(((num >> 8) & 0xff))
# (pip show, not an import: importing pyslurm loads libslurm, which exits the process without a slurm.conf)
have=$("$PY" -m pip show pyslurm 2>/dev/null | sed -n 's/^Version: //p' || true) # pip show: 1 when absent
if [[ $have == "$major".* ]]; then
    log "pyslurm $have for Slurm $major already in $VENV"
    exit 0
fi
t0=$SECONDS
log "building pyslurm==$major.* against $prefix into $VENV (a few minutes)"
# the rpath lets `import pyslurm` find this libslurm without LD_LIBRARY_PATH; -O1 builds faster than -O2
SLURM_INCLUDE_DIR=$prefix/include SLURM_LIB_DIR=$prefix/lib \
    LDFLAGS="-Wl,-rpath,$prefix/lib" CFLAGS="-O1 -g0" \
    "$PY" -m pip install -q "pyslurm==$major.*" 2>&1 | { grep -v 'is ignored: it is neither' || true; }
# (pipefail: pip's own exit status still decides; the filter drops warnings about unreachable local indexes)
log "pyslurm installed in $((SECONDS - t0)) s"
