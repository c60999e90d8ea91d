#!/bin/bash
# Same database and machine, back to back: cocaq aggregate --full without ([shifting] slack_s = 0) and with
# (24 h) the when-to-run figures; the first run of each setting rewrites every job's figures (not timed).
cd "$(dirname "$0")/.."
export COCAQ_CONFIG=bench/bench.toml COCAQ_DATABASE_URL=postgresql+psycopg://postgres@127.0.0.1:5432/cocaq_bench_agg
for s in 0 86400; do
  COCAQ_SHIFTING__SLACK_S=$s .venv/bin/cocaq aggregate --full >/dev/null 2>&1
  for i in 1 2 3; do
    t0=$(date +%s.%N); COCAQ_SHIFTING__SLACK_S=$s .venv/bin/cocaq -v aggregate --full 2>&1 | grep -o "deriving jobs [0-9.]* s, rollups [0-9.]* s"; t1=$(date +%s.%N)
    echo "slack=$s run=$i wall=$(echo "$t1 - $t0" | bc)"
  done
done
for i in 1 2 3 4 5; do t0=$(date +%s.%N); .venv/bin/python -m cocaq --version >/dev/null; t1=$(date +%s.%N); echo "floor $(echo "$t1 - $t0" | bc)"; done
