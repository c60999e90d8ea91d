#!/usr/bin/env bash
# Run the demo at a fixed clock (faketime) and keep every output it makes (its e-mails and pages, with
# and without the e-mail study), `cocaq user/lab/job` as tables and JSON for every user and lab and a
# sample of jobs, and the read API's answers (scripts/api_snapshot.py), with the few values that change
# run to run (Message-IDs, boundaries, timings) masked, so that two checkouts can be compared with
# `diff -r`: scripts/same-outputs.sh does that against a commit.  Usage: scripts/demo-snapshot.sh OUTDIR [COCAQ]
set -euo pipefail
out=$(realpath -m "$1"); cocaq=$(realpath "${2:-.venv/bin/cocaq}"); here=$(cd "$(dirname "$0")" && pwd)
python=$(dirname "$cocaq")/python
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
db=$out/run/demo.db
users=$(sqlite3 "$db" "SELECT DISTINCT user_name FROM jobs ORDER BY 1")
labs=$(sqlite3 "$db" "SELECT DISTINCT account FROM jobs ORDER BY 1")
jobs=$(sqlite3 "$db" "SELECT job_id FROM jobs WHERE id % 120 = 0 ORDER BY id")
win=(-S 2026-10-01T00:00:00 -E 2026-11-20T10:30:00)
{
  for u in $users; do ft "$cocaq" --config $cfg user "$u" "${win[@]}" -o json; ft "$cocaq" --config $cfg user "$u" --since 30d; done
  for l in $labs; do ft "$cocaq" --config $cfg lab "$l" "${win[@]}" -o json; ft "$cocaq" --config $cfg lab "$l" --since 30d; done
  for j in $jobs; do ft "$cocaq" --config $cfg job "$j" -o json; ft "$cocaq" --config $cfg job "$j"; done
} > cli-all.txt 2>&1 || true
ft "$python" "$here/api_snapshot.py" $cfg api > api.txt 2>&1 || true
# the demo with the e-mail study: its month-by-month e-mails and the study's report
mkdir study && (cd study && export HOME=$out/run/study/home COCAQ_DATABASE_URL=sqlite:///$out/run/study/demo.db &&
  ft "$cocaq" demo --study > demo.txt 2>&1 && ft "$cocaq" --config cocaq-demo/cocaq-demo-study.toml study report >> demo.txt 2>&1) || true
rm -rf study/home study/demo.db
cd "$out"
mv run/demo.txt run/cli.txt run/cli-all.txt run/api.txt run/api run/cocaq-demo run/study . && rm -rf run
# mask what differs run to run: MIME boundaries, Message-IDs, elapsed times
find . -type f -print0 | xargs -0 sed -i -E \
  -e 's/<[0-9]+\.[0-9]+\.[0-9]+\.cocaq@/<MASKED.cocaq@/g' \
  -e 's/={10,}[0-9]+==/=BOUNDARY==/g' \
  -e 's/\(([0-9]+\.)?[0-9]+ s\)/(N s)/g' \
  -e "s#$out#OUT#g" -e 's#/[^ ]*/\.venv/bin/cocaq#COCAQ#g'
# an outbox names each file by its Message-ID (the clock, a pid, a random part): name it by its masked
# content instead, so that the same messages give the same names
find . -type d -name outbox -print0 | while IFS= read -r -d '' box; do
  for f in "$box"/*.eml; do [ -e "$f" ] && mv "$f" "$box/$(md5sum < "$f" | cut -c1-16).eml"; done
done
echo "demo-snapshot: $out"
