#!/usr/bin/env bash
# The long fault-injection run: a mixed fleet (3 beats, 4 prefork and threads workers,
# a worker without the package, clocks 2 minutes ahead and behind) on private
# PostgreSQL and Redis servers, faults from a seeded plan, then the check of every
# guarantee and a table of violations by fault kind.
#   scripts/chaos.sh [--seed N] [--duration SECONDS | --runs N] [--show-logs] [--keep-logs DIR]
# (default: 600 s, a random seed, printed first; --help for the fleet's options).
# Needs initdb, pg_ctl and redis-server.
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
