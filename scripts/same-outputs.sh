#!/usr/bin/env bash
# Show that this checkout's outputs are byte-identical to a commit's (issue 37: a refactor changes no
# output): scripts/demo-snapshot.sh on both, with the same venv (the commit's code is put first on
# PYTHONPATH, so its own modules are the ones imported), then `diff -r`. Exits 1 on any difference.
# Usage: scripts/same-outputs.sh [BASE] (default: origin's main, else HEAD~1)   Needs faketime, sqlite3.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd); cd "$root"
base=$(git rev-parse --verify "${1:-$(git rev-parse -q --verify origin/main || git rev-parse HEAD~1)}^{commit}")  # a commit, fixed now: a branch may move while this runs
work=$(mktemp -d /tmp/cocaq-same.XXXXXX)
git worktree add -q --detach "$work/base" "$base"
trap 'git worktree remove --force "$work/base"; rm -rf "$work"' EXIT
# the same snapshot script for both: this checkout's
cp scripts/demo-snapshot.sh scripts/api_snapshot.py "$work/base/scripts/"
PYTHONPATH=$work/base bash "$work/base/scripts/demo-snapshot.sh" "$work/before" "$root/.venv/bin/cocaq" >/dev/null 2>&1
bash scripts/demo-snapshot.sh "$work/after" "$root/.venv/bin/cocaq" >/dev/null 2>&1
if diff -r "$work/before" "$work/after" > "$work/diff.txt"; then
  echo "same-outputs: byte-identical to $(git rev-parse --short "$base") ($(find "$work/after" -type f | wc -l) files)"
else
  head -c 4000 "$work/diff.txt"; echo; echo "same-outputs: outputs differ from $(git rev-parse --short "$base")" >&2; exit 1
fi
