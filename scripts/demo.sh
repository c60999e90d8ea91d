#!/usr/bin/env bash
# Quick start, part 1: install cocaq into .venv and run `cocaq demo` on an embedded SQLite database.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup-venv.sh
exec .venv/bin/cocaq demo "$@"
