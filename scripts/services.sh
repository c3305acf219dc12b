#!/usr/bin/env bash
# Make sure PostgreSQL (127.0.0.1:5432) and Redis (127.0.0.1:6379) answer.
# A service that is down is started from the local installation if there is one;
# otherwise this says how to start both with Docker and exits 1.
set -uo pipefail

PG_PORT=${PG_PORT:-5432}
REDIS_PORT=${REDIS_PORT:-6379}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
STATE="$ROOT/.cluster"

listening() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

wait_for() { # port name
  for _ in $(seq 1 50); do listening "$1" && return 0; sleep 0.2; done
  echo "services: $2 was started but does not answer on 127.0.0.1:$1; see its log" >&2
  return 1
}

give_up() {
  echo "services: $1 is not running on 127.0.0.1:$2 and no local installation was found." >&2
  echo "services: start both with: docker compose up -d postgres redis" >&2
  exit 1
}

start_postgres() {
  if command -v pg_ctlcluster >/dev/null 2>&1 && [ -d /etc/postgresql ] && [ -n "$(ls /etc/postgresql 2>/dev/null)" ]; then
    local version
    version=$(ls /etc/postgresql | sort -V | tail -n 1)
    echo "services: starting PostgreSQL $version (pg_ctlcluster)"
    pg_ctlcluster --skip-systemctl-redirect "$version" main start || true
    return
  fi
  local pg_ctl
  pg_ctl=$(command -v pg_ctl || ls /usr/lib/postgresql/*/bin/pg_ctl 2>/dev/null | sort -V | tail -n 1)
  [ -n "$pg_ctl" ] || give_up PostgreSQL "$PG_PORT"
  local bindir data
  bindir=$(dirname "$pg_ctl")
  data="$STATE/postgres"
  if [ ! -d "$data" ]; then
    echo "services: creating a local PostgreSQL cluster in $data (trust auth, user postgres)"
    mkdir -p "$STATE"
    "$bindir/initdb" -D "$data" -U postgres --auth=trust >/dev/null
  fi
  echo "services: starting PostgreSQL from $bindir"
  "$pg_ctl" -D "$data" -l "$STATE/postgres.log" -o "-p $PG_PORT -k /tmp -c listen_addresses=127.0.0.1" start >/dev/null
}

start_redis() {
  command -v redis-server >/dev/null 2>&1 || give_up Redis "$REDIS_PORT"
  local dir=/var/lib/redis logdir=/var/log/redis
  [ -w "$dir" ] || dir="$STATE"
  [ -w "$logdir" ] || logdir="$STATE"
  mkdir -p "$dir" "$logdir" 2>/dev/null || true
  echo "services: starting Redis"
  redis-server --daemonize yes --bind 127.0.0.1 -::1 --port "$REDIS_PORT" --save "" --appendonly no \
    --dir "$dir" --logfile "$logdir/ci.log"
}

if ! listening "$PG_PORT"; then start_postgres; wait_for "$PG_PORT" PostgreSQL || exit 1; fi
if ! listening "$REDIS_PORT"; then start_redis; wait_for "$REDIS_PORT" Redis || exit 1; fi
echo "services: PostgreSQL on 127.0.0.1:$PG_PORT and Redis on 127.0.0.1:$REDIS_PORT are up"
