#!/usr/bin/env bash
# Start the local PostgreSQL cluster if it is down and create our role and database.
set -euo pipefail
if ! pg_isready -h 127.0.0.1 -p 5432 -q 2>/dev/null; then
  version=$(ls /etc/postgresql 2>/dev/null | sort -V | tail -n 1)
  if [ -z "$version" ]; then
    echo "no PostgreSQL cluster found under /etc/postgresql" >&2; exit 1
  fi
  if ! pg_lsclusters -h 2>/dev/null | grep -q "^$version main"; then
    pg_createcluster "$version" main >/dev/null
  fi
  pg_ctlcluster --skip-systemctl-redirect "$version" main start
  for _ in $(seq 1 50); do pg_isready -h 127.0.0.1 -p 5432 -q && break; sleep 0.2; done
fi
psql_as_admin() {
  if [ "$(id -u)" = 0 ] && id postgres >/dev/null 2>&1; then
    su postgres -c "psql -v ON_ERROR_STOP=1 -qAt -c \"$1\""
  else
    psql -h 127.0.0.1 -U postgres -v ON_ERROR_STOP=1 -qAt -c "$1"
  fi
}
psql_as_admin "SELECT 1 FROM pg_roles WHERE rolname='redislock'" | grep -q 1 ||
  psql_as_admin "CREATE ROLE redislock LOGIN PASSWORD 'redislock' CREATEDB"
psql_as_admin "SELECT 1 FROM pg_database WHERE datname='redislock'" | grep -q 1 ||
  psql_as_admin "CREATE DATABASE redislock OWNER redislock"
echo "== PostgreSQL ready"
