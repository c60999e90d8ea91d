#!/usr/bin/env bash
# Run the demo at a fixed clock (faketime) and keep every output it makes, plus the main CLI views of it,
# with the few values that change run to run (Message-IDs, boundaries, timings) masked, so that two
# checkouts can be compared with `diff -r`.  Usage: scripts/demo-snapshot.sh OUTDIR [COCAQ]
set -euo pipefail
out=$(realpath -m "$1"); cocaq=$(realpath "${2:-.venv/bin/cocaq}")
command -v faketime >/dev/null || { echo "demo-snapshot: needs faketime (apt-get install faketime)" >&2; exit 1; }
rm -rf "$out" && mkdir -p "$out/run"
cd "$out/run"
export PYTHONHASHSEED=0 HOME=$out/run/home COCAQ_DATABASE_URL=sqlite:///$out/run/demo.db COLUMNS=100 TZ=UTC
ft() { FAKETIME_DONT_RESET=1 faketime -f '@2026-11-20 10:30:00 x0' "$@"; }
ft "$cocaq" demo > demo.txt 2>&1
cfg=cocaq-demo/cocaq-demo.toml
{
  for u in dave erin bob; do ft "$cocaq" --config $cfg user $u --since 30d; done
  ft "$cocaq" --config $cfg user erin -S 2w --format json
  ft "$cocaq" --config $cfg user dave --since 30d --format csv
  for l in lab_nlp lab_vision; do ft "$cocaq" --config $cfg lab $l --since 30d; done
  ft "$cocaq" --config $cfg lab lab_nlp --since 30d --format json
  ft "$cocaq" --config $cfg job 410352
  ft "$cocaq" --config $cfg job 410382 --format json
  ft "$cocaq" --config $cfg models --since 30d
} > cli.txt 2>&1 || true
cd "$out"
mv run/demo.txt run/cli.txt run/cocaq-demo . && rm -rf run
# mask what differs run to run: MIME boundaries, Message-IDs, elapsed times
find . -type f -print0 | xargs -0 sed -i -E \
  -e 's/<[0-9]+\.[0-9]+\.[0-9]+\.cocaq@/<MASKED.cocaq@/g' \
  -e 's/={10,}[0-9]+==/=BOUNDARY==/g' \
  -e 's/\(([0-9]+\.)?[0-9]+ s\)/(N s)/g' \
  -e "s#$out#OUT#g" -e 's#/[^ ]*/\.venv/bin/cocaq#COCAQ#g'
echo "demo-snapshot: $out"
