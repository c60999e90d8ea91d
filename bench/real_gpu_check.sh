#!/usr/bin/env bash
# The node side on one real NVIDIA GPU, end to end (prolog, collector, a two-power job, epilog, ship,
# aggregate), in under 5 minutes and offline: docs/benchmarks/real-gpu-check.md says how to read it.
#   bash bench/real_gpu_check.sh [--fake] [--json FILE] [...]     (bench/real_gpu_check.py --help)
# PYTHON: the interpreter with torch and nvidia-ml-py (default python3). cocaq's own dependencies come
# from it, or else from the wheelhouse .wheels/ (made as the doc says), unpacked for cocaq's commands only.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if ! command -v "$PY" >/dev/null; then
    echo "real_gpu_check: no Python at PYTHON=$PY" >&2
    exit 2
fi
if ! "$PY" -c 'import sys; assert sys.version_info >= (3, 11)' 2>/dev/null; then
    echo "real_gpu_check: needs Python 3.11 or newer (PYTHON=$PY is $("$PY" --version 2>&1))" >&2
    exit 2
fi
exec "$PY" bench/real_gpu_check.py "$@"
