#!/usr/bin/env bash
# Install the project into .venv, make sure PostgreSQL and Redis run (starting them
# from local binaries if needed), create the schema, then run a local cluster on the
# demo jobs in tasks/: two beat processes (one leads, one stands by), two workers,
# Flower and the schedules UI. Logs go to .cluster/logs/; Ctrl-C stops everything.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
echo "quickstart: installing into .venv"
.venv/bin/python -m pip install --quiet --upgrade pip
.venv/bin/python -m pip install --quiet -e .
bash scripts/services.sh

export DATABASE_URL=${DATABASE_URL:-postgresql+psycopg://postgres@127.0.0.1:5432/habeat}
export REDIS_URL=${REDIS_URL:-redis://127.0.0.1:6379/0}
# The demo app (app/) and its jobs (tasks/) run from the checkout; only beat/ is installed.
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
if [ -z "${FLOWER_BASIC_AUTH:-}" ]; then
  FLOWER_BASIC_AUTH="admin:$(.venv/bin/python -c 'import secrets; print(secrets.token_urlsafe(12))')"
  export FLOWER_BASIC_AUTH
fi
# The schedules UI asks for the same password as Flower unless told otherwise.
export HABEAT_UI_BASIC_AUTH=${HABEAT_UI_BASIC_AUTH:-$FLOWER_BASIC_AUTH}
export HABEAT_UI_FLOWER_URL=${HABEAT_UI_FLOWER_URL:-http://127.0.0.1:5555}
CELERY=(.venv/bin/celery -A app)
LOGS=.cluster/logs
mkdir -p "$LOGS"

"${CELERY[@]}" schedules migrate

pids=()
start() { # name, celery arguments...
  local name=$1; shift
  "${CELERY[@]}" "$@" >"$LOGS/$name.log" 2>&1 &
  pids+=($!)
}
stopping=
stop() {
  [ -z "$stopping" ] || return 0
  stopping=1
  echo; echo "quickstart: stopping the cluster"
  kill -TERM "${pids[@]}" 2>/dev/null || true
  wait "${pids[@]}" 2>/dev/null || true
  exit 0
}
trap stop INT TERM

start beat1 beat -l info
start beat2 beat -l info
start worker1 worker -l info -n worker1@%h -c 2
start worker2 worker -l info -n worker2@%h -c 2
start flower flower --port=5555 --address=127.0.0.1
start ui schedules ui --port 5556 --address 127.0.0.1

cat <<INFO
quickstart: cluster running (logs in $LOGS/)
  beats:    2 (one leads; kill it and the other takes over)
  workers:  2
  Flower:   http://127.0.0.1:5555  (user:password ${FLOWER_BASIC_AUTH})
  UI:       http://127.0.0.1:5556  (schedules, runs, cluster, plots; user:password ${HABEAT_UI_BASIC_AUTH})
  try:      .venv/bin/celery -A app schedules list
Ctrl-C stops everything. Following the leader's and workers' logs:
INFO
tail -n 0 -F "$LOGS/beat1.log" "$LOGS/beat2.log" "$LOGS/worker1.log" "$LOGS/worker2.log" \
  | grep --line-buffered -E "leads|claimed|released|lost|succeeded|ERROR" &
pids+=($!)
wait "${pids[0]}"
