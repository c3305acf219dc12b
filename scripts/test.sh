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

# Two pytest processes, each test file on one of them: most of the time goes to
# waiting for real servers, fire times and leases, not to the CPU. Each process
# has its own database, Redis key prefix and private servers (tests/conftest.py).
# `-n 0` in the arguments runs everything in this process.
exec .venv/bin/pytest -n "${HABEAT_TEST_PROCESSES:-2}" --dist loadfile "$@"
