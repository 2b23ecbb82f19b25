#!/bin/sh
# pg_ctl for the tests' throwaway PostgreSQL (tests/pg.py): PostgreSQL refuses to run as root, so as root it
# runs as the `postgres` system user; as anyone else it runs as that user. Every path it is given is absolute.
set -eu
PG_CTL="${TOOLLOOP_TEST_PG_BIN:-/usr/lib/postgresql/15/bin}/pg_ctl"
cd /
if [ "$(id -u)" -eq 0 ]; then
    exec runuser -u postgres -- "$PG_CTL" "$@"
fi
exec "$PG_CTL" "$@"
