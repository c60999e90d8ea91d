#!/usr/bin/env bash
# Create .venv with the locked dependencies and cocaq itself (editable). Idempotent; fast when done already.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if ! "$PY" -c 'import sys; assert sys.version_info >= (3, 11)' 2>/dev/null; then
    echo "setup: cocaq needs Python 3.11 or newer (found: $("$PY" --version 2>&1 || echo none))" >&2
    exit 1
fi
if [ ! -x .venv/bin/python ]; then
    if ! "$PY" -m venv .venv 2>/dev/null; then
        rm -rf .venv
        if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
            echo "setup: installing python3-venv" >&2
            scripts/apt-install.sh python3-venv
            "$PY" -m venv .venv
        else
            echo "setup: '$PY -m venv' failed: install python3-venv (sudo apt-get install python3-venv)" >&2
            exit 1
        fi
    fi
fi
stamp=.venv/.cocaq-lock.sha256
want=$(sha256sum requirements.lock pyproject.toml | sha256sum | cut -d' ' -f1)
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
    # (pipefail keeps pip's exit status; the filter drops warnings about unreachable local indexes)
    pip() { .venv/bin/python -m pip -q --disable-pip-version-check "$@" 2>&1 | { grep -v 'is ignored: it is neither' || true; }; }
    pip install --require-hashes -r requirements.lock
    pip install --no-deps --no-build-isolation -e .
    echo "$want" > "$stamp"
fi
