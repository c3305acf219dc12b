#!/usr/bin/env bash
# The test command: installs into .venv, makes sure PostgreSQL and Redis run,
# then lint, type check and every test layer (unit, integration, end-to-end).
# Extra arguments go to pytest, e.g. `scripts/test.sh tests/unit -q`.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
.venv/bin/python -m pip install --quiet --upgrade pip
.venv/bin/python -m pip install --quiet -e '.[dev]'

bash scripts/services.sh

.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/mypy

exec .venv/bin/pytest "$@"
