#!/bin/sh
# Initialises the catalog database once (user and database `kernelbox`, password from
# $POSTGRES_PASSWORD_FILE), then runs PostgreSQL in the foreground as `postgres`.
set -eu
bin=/usr/lib/postgresql/15/bin
mkdir -p "$PGDATA" /run/postgresql
chown -R postgres:postgres "$PGDATA" /run/postgresql
chmod 700 "$PGDATA"
if [ ! -s "$PGDATA/PG_VERSION" ]; then
  pw=$(cat "${POSTGRES_PASSWORD_FILE:?a file with the password}")
  su postgres -c "$bin/initdb -D $PGDATA -U postgres --auth-local=trust --auth-host=scram-sha-256" >/dev/null
  echo "host all all 0.0.0.0/0 scram-sha-256" >> "$PGDATA/pg_hba.conf"
  su postgres -c "$bin/pg_ctl -D $PGDATA -o '-c listen_addresses=' -w start" >/dev/null
  su postgres -c "psql -v ON_ERROR_STOP=1 -q" <<SQL
CREATE USER kernelbox PASSWORD '$pw';
CREATE DATABASE kernelbox OWNER kernelbox;
SQL
  su postgres -c "$bin/pg_ctl -D $PGDATA -m fast -w stop" >/dev/null
fi
exec su postgres -c "exec $bin/postgres -D $PGDATA -c listen_addresses='*' -c max_connections=200"
