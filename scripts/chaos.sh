#!/usr/bin/env bash
# The long fault-injection run: a 3-beat, 3-worker cluster on private PostgreSQL
# and Redis servers, faults from a seeded plan, then the check of every guarantee.
#   scripts/chaos.sh [--seed N] [--duration SECONDS] [--show-logs] [--keep-logs DIR]
# (default: 600 s, a random seed, printed first). Needs initdb, pg_ctl and redis-server.
# Installs the project with its dev extra into .venv first (the suite is part of the
# tests: it needs pytest and the test helpers' dependencies), as scripts/test.sh does.
# Exits 1 on a violation (the summary prints the seed and the command to reproduce).
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
.venv/bin/python -m pip install --quiet --upgrade pip
.venv/bin/python -m pip install --quiet -e '.[dev]'

exec .venv/bin/python -m tests.chaos "$@"
