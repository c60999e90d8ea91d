#!/usr/bin/env bash
# Quick start, part 2: install everything the tests need, start PostgreSQL, run linters and the whole suite.
# Extra arguments go to pytest (e.g. scripts/test.sh -k sacct).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup-venv.sh
# shellcheck source=scripts/test-postgres.sh
source scripts/test-postgres.sh
echo "== ruff" && .venv/bin/ruff check .
echo "== mypy" && scripts/typecheck.sh
echo "== pytest (PostgreSQL: $COCAQ_TEST_PG_URL)"
exec .venv/bin/python -m pytest "$@"
