#!/usr/bin/env bash
# Build and install Slurm from a source tarball under its own prefix, for the 25.11 test cluster
# (tests/slurm/cluster.sh up 25.11 calls this).  Cached: a second call with the same tarball and flags
# does nothing.  Runs as root (installs build dependencies with apt-get on first use).
#
#   tests/slurm/build.sh            # build COCAQ_SLURM_SOURCE into COCAQ_SLURM25_PREFIX, print the prefix
#   tests/slurm/build.sh --check    # exit 0 if the cached build is there and current, 3 if the source is missing
#
# Knobs:
#   COCAQ_SLURM_SOURCE     the tarball (default: ../shared/vendor/slurm-25.11.7.tar.gz beside the repository)
#   COCAQ_SLURM25_PREFIX   where it is installed (default /opt/cocaq-slurm-<version>)
#   COCAQ_SLURM25_SYSCONF  its configuration folder, compiled in as the default (default /etc/slurm-<major.minor>)
#
# Exit 3 (and one line on stderr) when the source is not there: callers skip the 25.11 tests with it.
set -euo pipefail
export LC_ALL=C.UTF-8

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
SOURCE=${COCAQ_SLURM_SOURCE:-$repo/../shared/vendor/slurm-25.11.7.tar.gz}

log() { printf '[build.sh %s] %s\n' "$(date +%T)" "$*" >&2; }

if [[ ! -f $SOURCE ]]; then
    echo "no Slurm source at $SOURCE: set COCAQ_SLURM_SOURCE to a slurm-25.11.x .tar.gz (SchedMD's release or 'git archive' of a slurm-25-11-* tag)" >&2
    exit 3
fi
# slurm-25.11.7.tar.gz -> 25.11.7
base=$(basename "$SOURCE")
VERSION=$(sed -n 's/^slurm-\([0-9][0-9]*\.[0-9][0-9]*\.[0-9][0-9]*\).*\.tar\.\(gz\|bz2\|xz\)$/\1/p' <<<"$base")
[[ -n $VERSION ]] || { echo "cannot read a Slurm version from the file name $base (want slurm-X.Y.Z.tar.gz)" >&2; exit 2; }
MAJOR=${VERSION%.*}
PREFIX=${COCAQ_SLURM25_PREFIX:-/opt/cocaq-slurm-$VERSION}
SYSCONF=${COCAQ_SLURM25_SYSCONF:-/etc/slurm-$MAJOR}
# A test build: no debug symbols, -O1 (compiles in about half the time of Slurm's default -O2 -ggdb3)
CONFIGURE=(--prefix="$PREFIX" --sysconfdir="$SYSCONF" --enable-pam=no --without-hdf5 --without-rrdtool
    --disable-x11 --without-pmix --without-ucx --without-nvml --without-rsmi --without-oneapi
    --disable-debug "CFLAGS=-O1 -g0")
# what the cache is keyed on: the tarball's bytes, the flags and this script's build recipe version
stamp_want="sha256=$(sha256sum "$SOURCE" | cut -d' ' -f1) flags=${CONFIGURE[*]} recipe=2"
STAMP=$PREFIX/.cocaq-build

built() { [[ -f $STAMP && $(cat "$STAMP") == "$stamp_want" && -x $PREFIX/bin/sacct && -x $PREFIX/sbin/slurmctld ]]; }
if built; then
    [[ ${1:-} == --check ]] && exit 0
    echo "$PREFIX"
    exit 0
fi
[[ ${1:-} == --check ]] && exit 1
[[ $(id -u) -eq 0 ]] || { echo "building Slurm $VERSION needs root (apt-get, $PREFIX)" >&2; exit 1; }
# one build at a time: scripts/test.sh starts one in the background, and the tests' `cluster.sh up 25.11`
# waits here for it rather than starting its own
mkdir -p /var/lock
exec 9>"/var/lock/cocaq-slurm-build-$VERSION.lock"
flock 9
if built; then
    echo "$PREFIX"
    exit 0
fi

deps=(build-essential libmunge-dev libmariadb-dev libjson-c-dev libhttp-parser-dev libyaml-dev munge)
missing=()
for p in "${deps[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if ((${#missing[@]})); then
    log "apt-get install ${missing[*]}"
    "$repo/scripts/apt-install.sh" "${missing[@]}" # waits for scripts/test.sh's own apt-get
fi

work=/var/cache/cocaq-slurm/build-$VERSION
rm -rf "$work"
mkdir -p "$work"
log "unpacking $SOURCE"
tar -xf "$SOURCE" -C "$work" --strip-components=1
t0=$SECONDS
log "configure + make -j$(nproc) + make install into $PREFIX (a few minutes; log: $work/build.log)"
(
    cd "$work"
    ./configure "${CONFIGURE[@]}" &&
        make -j"$(nproc)" &&
        rm -rf "$PREFIX" &&
        make install
) >"$work/build.log" 2>&1 || { tail -30 "$work/build.log" >&2; log "build failed (whole log: $work/build.log)"; exit 1; }
# headers pyslurm builds against, and the version the cache is for
printf '%s' "$stamp_want" >"$STAMP"
log "Slurm $VERSION built in $((SECONDS - t0)) s"
# the object files are not needed again (the cache is the installed prefix)
rm -rf "$work"
echo "$PREFIX"
