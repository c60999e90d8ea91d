#!/usr/bin/env bash
# mypy over the package as it is installed, on the checkout as it is: cocaq/ holds relative symlinks to
# the root folders (collector/ -> cocaq.collector, ...), so no build or tree of links is needed.
set -euo pipefail
cd "$(dirname "$0")/.."
exec .venv/bin/mypy --cache-dir .venv/mypy-cache "$@"
