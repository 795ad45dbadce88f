#!/usr/bin/env bash
# Install (from Debian's packages, when absent) and start the servers the test
# suite and the production smoke test need: PostgreSQL and Redis.
# Prints `export VAR=...` lines for the URLs; eval its output.
set -euo pipefail

PG_PASSWORD="${BOTMESH_PG_PASSWORD:-botmesh}"
REDIS_PORT="${BOTMESH_REDIS_PORT:-6379}"

need=()
command -v redis-server >/dev/null 2>&1 || need+=(redis-server)
ls /usr/lib/postgresql/*/bin/postgres >/dev/null 2>&1 || need+=(postgresql)
command -v chromium >/dev/null 2>&1 || need+=(chromium)
command -v promtool >/dev/null 2>&1 || need+=(prometheus)
if ((${#need[@]})); then
  echo "installing: ${need[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >&2
  apt-get install -y -qq "${need[@]}" >&2
fi

# PostgreSQL: start the first cluster, set a password for TCP logins, create the databases.
ver="$(ls /usr/lib/postgresql | sort -V | tail -1)"
if ! pg_lsclusters -h | grep -q .; then
  pg_createcluster "$ver" main >&2
fi
cluster="$(pg_lsclusters -h | head -1 | awk '{print $1" "$2}')"
port="$(pg_lsclusters -h | head -1 | awk '{print $3}')"
pg_lsclusters -h | head -1 | grep -q online || pg_ctlcluster $cluster start >&2
for _ in $(seq 1 50); do
  su postgres -c "psql -p $port -Atqc 'select 1'" >/dev/null 2>&1 && break
  sleep 0.2
done
su postgres -c "psql -p $port -qc \"ALTER USER postgres PASSWORD '$PG_PASSWORD'\"" >&2
for db in botmesh botmesh_test; do
  su postgres -c "psql -p $port -Atqc \"select 1 from pg_database where datname='$db'\"" | grep -q 1 \
    || su postgres -c "createdb -p $port $db" >&2
done

# Redis: a standalone server on $REDIS_PORT (no persistence; tests own it).
if ! redis-cli -p "$REDIS_PORT" ping >/dev/null 2>&1; then
  redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --save '' --appendonly no --daemonize yes \
    --logfile /tmp/botmesh-redis-"$REDIS_PORT".log >&2
  for _ in $(seq 1 50); do redis-cli -p "$REDIS_PORT" ping >/dev/null 2>&1 && break; sleep 0.1; done
fi

echo "export BOTMESH_TEST_POSTGRES_URL=postgresql://postgres:$PG_PASSWORD@127.0.0.1:$port/botmesh_test"
echo "export BOTMESH_TEST_REDIS_URL=redis://127.0.0.1:$REDIS_PORT/0"
echo "export BOTMESH_PROD_DATABASE_URL=postgresql://postgres:$PG_PASSWORD@127.0.0.1:$port/botmesh"
