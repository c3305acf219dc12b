"""Bad input, careless or hostile, from every entry point: the CLI, the Python API and
code schedules (``beat_schedule``). Each is refused with one line that names the fix,
exit code 2 on the command line, and nothing written (checked in the database); or
it has the behaviour the README documents.

The CLI runs in-process (Celery's own ``celery`` click group, as in ``test_cli``),
with exceptions propagating: a traceback fails the test.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis
from celery import Celery
from click.testing import Result

from app.factory import create_app
from beat.api import Schedules
from beat.store import Store
from tests.conftest import SessionEnv
from tests.integration.helpers import error_lines, invoke, table_rows

pytestmark = pytest.mark.integration


@pytest.fixture
def app(test_env: SessionEnv, store: Store, redis_client: redis.Redis) -> Celery:
    """This session's app, on empty tables, with one schedule made at runtime."""
    app = create_app(test_env.settings())
    return app


@pytest.fixture
def schedules(app: Celery) -> Iterator[Schedules]:
    manager = Schedules.for_app(app)
    yield manager
    manager.store.dispose()


@pytest.fixture
def seeded(schedules: Schedules) -> Schedules:
    """An ``existing`` schedule, for the commands that name one."""
    schedules.create("existing", "tasks.demo.add", every=60, args=[1, 2])
    return schedules


def refused(app: Celery, store: Store, *args: str) -> str:
    """Run the command; assert exit 2, one error line, no output, nothing written."""
    before = table_rows(store)
    result = invoke(app, *args)
    assert_one_line_exit_2(result)
    assert table_rows(store) == before, "a refused command wrote to the database"
    return error_lines(result)[0]


def assert_one_line_exit_2(result: Result) -> None:
    assert result.exit_code == 2, f"exit {result.exit_code}: {result.output}"
    assert result.stdout == ""
    assert result.stderr.count("\n") == 1, f"not one line: {result.stderr!r}"
    assert result.stderr.startswith("Error: "), result.stderr


# -- usage errors of every command: one line, not click's four -------------------------------

USAGE_ERRORS = [
    pytest.param(["add", "x", "tasks.demo.add", "--bogus"], "--bogus", id="unknown-option"),
    pytest.param(["add", "x"], "TASK", id="missing-argument"),
    pytest.param(["add", "x", "tasks.demo.add", "--every"], "--every", id="option-without-value"),
    pytest.param(["backfill", "existing", "--to", "2026-01-01T00:00:00+00:00"], "--from",
                 id="missing-option"),
    pytest.param(["runs", "--limit", "0"], "--limit", id="out-of-range"),
    pytest.param(["runs", "--state", "exploded"], "--state", id="bad-choice"),
    pytest.param(["prune", "--older-than", "banana"], "--older-than", id="bad-value"),
    pytest.param(["list", "extra"], "extra", id="extra-argument"),
    pytest.param(["nosuchcommand"], "nosuchcommand", id="unknown-command"),
    pytest.param(["--bogus", "list"], "--bogus", id="unknown-group-option"),
]  # fmt: skip


@pytest.mark.parametrize(("args", "says"), USAGE_ERRORS)
def test_usage_errors_are_one_line_with_exit_2(
    app: Celery, store: Store, seeded: Schedules, args: list[str], says: str
) -> None:
    line = refused(app, store, *args)
    assert says in line
    assert "--help" in line, "the line says where the options are listed"
