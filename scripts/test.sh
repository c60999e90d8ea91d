#!/usr/bin/env bash
# Quick start, part 2: install everything the tests need, start PostgreSQL, run linters and the whole suite.
# Extra arguments go to pytest (e.g. scripts/test.sh -k sacct).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup-venv.sh
# shellcheck source=scripts/test-postgres.sh
source scripts/test-postgres.sh
# As root: the one-node Slurm 22.05 cluster that tests/test_slurm_jobs.py runs real jobs on (installs
# slurm, munge and mariadb on first use; idempotent; also takes out hooks an interrupted run left in
# slurm.conf). Not fatal here: the test module brings it up again and says why if it cannot.
if [ "$(id -u)" = 0 ]; then
    echo "== slurm: tests/slurm/cluster.sh up"
    tests/slurm/cluster.sh up || echo "test: tests/slurm/cluster.sh up failed; tests/test_slurm_jobs.py will say why" >&2
    # Slurm 25.11 from its source (COCAQ_SLURM_SOURCE), then pyslurm against it: compiled in the background
    # (cached after the first time) while the suite runs; the 25.11 tests run last and wait for it.
    if tests/slurm/build.sh --check >/dev/null 2>&1 || [ "$?" != 3 ]; then
        log=${TMPDIR:-/tmp}/cocaq-slurm-25.11-build.log
        echo "== slurm 25.11 + pyslurm: tests/slurm/pyslurm.sh in the background (log: $log)"
        nohup tests/slurm/pyslurm.sh >"$log" 2>&1 &
    else
        tests/slurm/build.sh --check || true # says where the source should be; the 25.11 tests skip
    fi
fi
# As root: Debian's Chromium for tests/test_report_screens.py, which opens the rendered reports headless and
# looks at screenshots (without it that module fails and says why; COCAQ_SKIP_SCREENSHOTS=1 skips it).
if [ "$(id -u)" = 0 ] && [ ! -x /usr/bin/chromium ] && command -v apt-get >/dev/null; then
    echo "== chromium: apt-get install chromium (first run only)"
    scripts/apt-install.sh chromium \
        || echo "test: chromium could not be installed; tests/test_report_screens.py will say why" >&2
fi
# As root: Debian's prometheus package (prometheus + promtool) for the tests that scrape cocaq's metrics with a
# real Prometheus and check its exposition and the Grafana dashboard's PromQL (tests/promkit.py). The package's
# own service is not started (no systemd here; the tests start their own servers on free ports).
if [ "$(id -u)" = 0 ] && ! command -v promtool >/dev/null && command -v apt-get >/dev/null; then
    echo "== prometheus: apt-get install prometheus (first run only)"
    scripts/apt-install.sh --no-install-recommends prometheus \
        || echo "test: prometheus could not be installed; the tests that need it will say why" >&2
fi
# As root: Debian's Passenger for tests/test_web_api.py, which serves the shipped ood/ folder with it as Open
# OnDemand's per-user server does (its Python loader, the folder's bin/python), as a test user.
if [ "$(id -u)" = 0 ] && ! command -v passenger >/dev/null && command -v apt-get >/dev/null; then
    echo "== passenger: apt-get install passenger (first run only)"
    scripts/apt-install.sh --no-install-recommends passenger \
        || echo "test: passenger could not be installed; tests/test_web_api.py will say why" >&2
fi
echo "== ruff" && .venv/bin/ruff check .
echo "== ruff format" && .venv/bin/ruff format --check .
echo "== mypy" && scripts/typecheck.sh
# pytest-xdist: COCAQ_TEST_WORKERS processes (default one per core; 1 runs the suite in this one process).
# Each real Slurm cluster's tests run on one worker, 25.11's last; the other modules are shared out
# (tests/parallel.py).
workers=${COCAQ_TEST_WORKERS:-$(nproc)}
if ! [[ $workers =~ ^[1-9][0-9]*$ ]]; then
    echo "test: COCAQ_TEST_WORKERS=$workers: expected a whole number of processes, 1 or more" >&2
    exit 2
fi
xdist=()
[ "$workers" -gt 1 ] && xdist=(-n "$workers" --dist load)
echo "== pytest (PostgreSQL: $COCAQ_TEST_PG_URL; $workers worker(s))"
exec .venv/bin/python -m pytest "${xdist[@]}" "$@"
