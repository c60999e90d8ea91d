#!/usr/bin/env bash
# mypy over the package as it is installed: cocaq/ plus the root folders that the wheel puts inside it
# (collector/ -> cocaq.collector, ...). A tree of symlinks gives mypy that layout without a build.
set -euo pipefail
cd "$(dirname "$0")/.."
tree=.venv/mypy-tree
rm -rf "$tree" && mkdir -p "$tree/cocaq"
for f in cocaq/*; do ln -s "$PWD/$f" "$tree/cocaq/"; done
for d in collector prolog_epilog reports migrations; do ln -s "$PWD/$d" "$tree/cocaq/$d"; done
cd "$tree" && exec ../bin/mypy --config-file ../../pyproject.toml --cache-dir ../mypy-cache -p cocaq "$@"
