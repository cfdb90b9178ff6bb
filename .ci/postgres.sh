#!/usr/bin/env bash
# A throw-away local PostgreSQL server for the multi-worker search tests.
#   bash .ci/postgres.sh            start one and print its URL (CI:
#                                   export HWNAS_TEST_POSTGRES_URL="$(bash .ci/postgres.sh)")
#   bash .ci/postgres.sh stop DIR   stop the server kept in DIR and delete DIR
# The server keeps its files in $HWNAS_PG_DIR (an empty directory; default: a new temporary
# one) and listens on a Unix socket there and on 127.0.0.1:$PGPORT. Installs the Debian packages
# when the server binaries are missing. $HWNAS_PG_OWNER (optional, .ci/run sets it to its PID) is
# kept in DIR/owner: a start first stops the servers of /tmp/hwnas-pg.* whose owner has died (a CI
# run killed before its exit trap ran), which would otherwise hold the port.
set -euo pipefail
PGPORT="${PGPORT:-54329}"
find_bin() { ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1; }
run() { if [ "$(id -u)" = 0 ]; then su postgres -s /bin/bash -c "$*"; else bash -c "$*"; fi; }
BIN="$(find_bin || true)"
stop_server() {  # stop_server DIR: stop the server kept in DIR and delete DIR
    if [ -n "$BIN" ] && [ -f "$1/db/postmaster.pid" ]; then
        run "'$BIN/pg_ctl' -D '$1/db' -m fast -w stop >/dev/null" || true
    fi
    rm -rf "$1"
}
if [ "${1:-}" = stop ]; then
    stop_server "${2:?usage: postgres.sh stop DIR}"
    exit 0
fi
for old in /tmp/hwnas-pg.*; do
    owner="$(cat "$old/owner" 2>/dev/null || true)"
    if [ -n "$owner" ] && ! kill -0 "$owner" 2>/dev/null; then
        echo "postgres.sh: stopping the server of a dead run (pid $owner) in $old" >&2
        stop_server "$old"
    fi
done
if [ -z "$BIN" ] || [ ! -x "$BIN/initdb" ]; then
    if command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
        (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql) >&2
        BIN="$(find_bin)"
    else
        echo "postgres.sh: PostgreSQL is not installed and cannot be installed here" >&2
        exit 1
    fi
fi
DATA="${HWNAS_PG_DIR:-$(mktemp -d /tmp/hwnas-pg.XXXXXX)}"
[ -n "${HWNAS_PG_OWNER:-}" ] && echo "$HWNAS_PG_OWNER" > "$DATA/owner"
[ "$(id -u)" = 0 ] && chown postgres "$DATA"
run "'$BIN/initdb' -D '$DATA/db' -A trust -U postgres >/dev/null"
if ! run "'$BIN/pg_ctl' -D '$DATA/db' -o '-p $PGPORT -k $DATA -c listen_addresses=127.0.0.1' -l '$DATA/log' -w start >/dev/null"; then
    echo "postgres.sh: the server did not start (is port $PGPORT taken? set PGPORT); its log: $DATA/log" >&2
    tail -n 5 "$DATA/log" >&2 || true
    exit 1
fi
echo "postgresql://postgres@127.0.0.1:$PGPORT/postgres"
