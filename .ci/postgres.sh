#!/usr/bin/env bash
# A throw-away local PostgreSQL server for the multi-worker search tests.
#   bash .ci/postgres.sh            start one and print its URL (CI:
#                                   export HWNAS_TEST_POSTGRES_URL="$(bash .ci/postgres.sh)")
#   bash .ci/postgres.sh stop DIR   stop the server kept in DIR and delete DIR
# The server keeps its files in $HWNAS_PG_DIR (an empty directory; default: a new temporary
# one) and listens on a Unix socket there and on 127.0.0.1:$PGPORT. Installs the Debian packages
# when the server binaries are missing.
set -euo pipefail
PGPORT="${PGPORT:-54329}"
find_bin() { ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1; }
run() { if [ "$(id -u)" = 0 ]; then su postgres -s /bin/bash -c "$*"; else bash -c "$*"; fi; }
BIN="$(find_bin || true)"
if [ "${1:-}" = stop ]; then
    DATA="${2:?usage: postgres.sh stop DIR}"
    if [ -n "$BIN" ] && [ -f "$DATA/db/postmaster.pid" ]; then
        run "'$BIN/pg_ctl' -D '$DATA/db' -m fast -w stop >/dev/null" || true
    fi
    rm -rf "$DATA"
    exit 0
fi
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
[ "$(id -u)" = 0 ] && chown postgres "$DATA"
run "'$BIN/initdb' -D '$DATA/db' -A trust -U postgres >/dev/null"
if ! run "'$BIN/pg_ctl' -D '$DATA/db' -o '-p $PGPORT -k $DATA -c listen_addresses=127.0.0.1' -l '$DATA/log' -w start >/dev/null"; then
    echo "postgres.sh: the server did not start (is port $PGPORT taken? set PGPORT); its log: $DATA/log" >&2
    tail -n 5 "$DATA/log" >&2 || true
    exit 1
fi
echo "postgresql://postgres@127.0.0.1:$PGPORT/postgres"
