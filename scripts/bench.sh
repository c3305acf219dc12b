#!/usr/bin/env bash
# The benchmark suite: this project's beat side by side with Celery's own beat
# (PersistentScheduler) and celery-redbeat, on this machine's PostgreSQL and Redis.
# Arguments go to `python -m bench`, e.g. `scripts/bench.sh lateness --sizes 1000`.
# It takes about half an hour for every suite; it asserts nothing.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
.venv/bin/python -m pip install --quiet -e '.[dev,bench]'

bash scripts/services.sh

exec .venv/bin/python -m bench "$@"
