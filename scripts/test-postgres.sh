#!/usr/bin/env bash
# Sourced by test.sh: make a PostgreSQL server reachable for the tests and export COCAQ_TEST_PG_URL.
# Order: an URL given in COCAQ_TEST_PG_URL; the local server on 127.0.0.1:5432 if user postgres may log
# in without a password (starting it if it is installed but down); else a private throwaway server.
pg_ok() { .venv/bin/python - "$1" <<'PY' >/dev/null 2>&1
import sys, psycopg
psycopg.connect(sys.argv[1].replace("postgresql+psycopg", "postgresql"), connect_timeout=3).close()
PY
}
if [ -n "${COCAQ_TEST_PG_URL:-}" ]; then
    pg_ok "$COCAQ_TEST_PG_URL" || { echo "test: COCAQ_TEST_PG_URL=$COCAQ_TEST_PG_URL is not reachable" >&2; exit 1; }
    return 0 2>/dev/null || exit 0
fi
local_url="postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
if ! pg_ok "$local_url" && command -v pg_ctlcluster >/dev/null && [ -d /etc/postgresql ]; then
    for v in /etc/postgresql/*; do
        pg_ctlcluster --skip-systemctl-redirect "$(basename "$v")" main start 2>/dev/null || true
    done
    for _ in $(seq 20); do pg_ok "$local_url" && break; sleep 0.5; done
fi
if pg_ok "$local_url"; then
    export COCAQ_TEST_PG_URL="$local_url"
else
    # A private server: trust auth on its own port and directory, owned by the postgres user.
    if ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then
        [ "$(id -u)" = 0 ] || { echo "test: PostgreSQL is not installed (apt-get install postgresql)" >&2; exit 1; }
        echo "test: installing PostgreSQL" >&2
        scripts/apt-install.sh postgresql
    fi
    bin=$(dirname "$(ls -d /usr/lib/postgresql/*/bin/initdb | sort -V | tail -1)")
    dir=${COCAQ_TEST_PG_DIR:-/tmp/cocaq-test-pg}
    port=${COCAQ_TEST_PG_PORT:-55432}
    as_pg=()
    if [ "$(id -u)" = 0 ]; then as_pg=(runuser -u postgres --); mkdir -p "$dir"; chown postgres "$dir"; fi
    if [ ! -f "$dir/PG_VERSION" ]; then
        "${as_pg[@]}" "$bin/initdb" -D "$dir" -U postgres --auth=trust -E UTF8 >/dev/null
    fi
    "${as_pg[@]}" "$bin/pg_ctl" -D "$dir" -o "-p $port -k /tmp -c listen_addresses=127.0.0.1" -l "$dir/log" -w start >/dev/null 2>&1 || true
    export COCAQ_TEST_PG_URL="postgresql+psycopg://postgres@127.0.0.1:$port/postgres"
    pg_ok "$COCAQ_TEST_PG_URL" || { echo "test: could not start PostgreSQL in $dir (see $dir/log)" >&2; exit 1; }
fi
