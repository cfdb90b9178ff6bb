#!/usr/bin/env bash
# Start a throw-away local PostgreSQL server for the multi-worker search tests and print its URL.
# Installs the Debian packages when the server binaries are missing. Usage (CI):
#   export HWNAS_TEST_POSTGRES_URL="$(bash .ci/postgres.sh)"
# The server lives in a temporary directory and listens on a Unix socket and 127.0.0.1:$PGPORT.
set -euo pipefail
PGPORT="${PGPORT:-54329}"
find_bin() { ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1; }
BIN="$(find_bin || true)"
if [ -z "$BIN" ] || [ ! -x "$BIN/initdb" ]; then
    if command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
        (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql) >&2
        BIN="$(find_bin)"
    else
        echo "postgres.sh: PostgreSQL is not installed and cannot be installed here" >&2
        exit 1
    fi
fi
DATA="$(mktemp -d /tmp/hwnas-pg.XXXXXX)"
run() { if [ "$(id -u)" = 0 ]; then su postgres -s /bin/bash -c "$*"; else bash -c "$*"; fi; }
[ "$(id -u)" = 0 ] && chown postgres "$DATA"
run "'$BIN/initdb' -D '$DATA/db' -A trust -U postgres >/dev/null"
run "'$BIN/pg_ctl' -D '$DATA/db' -o '-p $PGPORT -k $DATA -c listen_addresses=127.0.0.1' -l '$DATA/log' -w start >/dev/null"
echo "postgresql://postgres@127.0.0.1:$PGPORT/postgres"
