"""Property-based fuzzing of every way a schedule is written: the Python API
(``Schedules.create``, which validates through ``define``) and the CLI (``schedules
add``), with names, crons, zones, times, numbers, nested JSON and option maps drawn
from valid, nearly valid and hostile values.

The properties: never a traceback, only our one-line errors (an ``InvalidSchedule``
of the API, or exit 2 with one ``Error:`` line); and never a partial write (a refused
schedule leaves every table as it was, an accepted one adds exactly its own row).

CI runs 100 examples of each, the same ones each time (``derandomize``). A long run
draws new ones, past the suite's 300-second timeout::

    HABEAT_FUZZ_EXAMPLES=40000 pytest tests/integration/test_fuzz_input.py \
        --hypothesis-seed=20261203 --timeout=0 --hypothesis-show-statistics
"""

from __future__ import annotations

import json
import os
import string
import zoneinfo
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
import redis
from celery import Celery
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from sqlalchemy import text

from app.factory import create_app
from beat.errors import InvalidSchedule
from beat.ops.schedules import Schedules
from beat.schedule.options import ALLOWED_OPTIONS, RESERVED_HEADERS
from beat.store.all_roles import Store
from tests.conftest import SessionEnv
from tests.integration.helpers import invoke, table_rows

pytestmark = pytest.mark.integration

#: More examples for a long run; CI's are few, and the same each time.
LONG_RUN = int(os.environ.get("HABEAT_FUZZ_EXAMPLES", "0"))
FUZZ = settings(
    max_examples=LONG_RUN or 100,
    derandomize=not LONG_RUN,
    database=None,
    deadline=None,
    # One store and app serve every example; each example undoes what it wrote.
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

# -- values: valid, nearly valid and hostile ------------------------------------------------

ZONES = sorted(zoneinfo.available_timezones())
TASKS = ["tasks.demo.add", "tasks.demo.report", "tasks.demo.heartbeat"]

any_text = st.text(st.characters(codec=None, exclude_categories=()), max_size=40)
valid_names = st.from_regex(r"[a-z][a-z0-9._:@/+-]{0,30}", fullmatch=True)
names = st.one_of(
    valid_names,
    any_text,
    st.text(string.printable, min_size=195, max_size=210),
)
tasks = st.one_of(st.sampled_from(TASKS), any_text, st.sampled_from(TASKS).map(str.upper))
zones = st.one_of(
    st.sampled_from(ZONES),
    st.sampled_from(["", "localtime", "UTC", "../../etc/passwd", "Europe/", "/etc/localtime"]),
    any_text,
)
cron_fields = st.one_of(
    st.sampled_from(["*", "*/5", "0", "59", "60", "1-5", "5-1", "mon-fri", "jan", "L", "15W",
                     "1#2", "L5", "?", "H", "R", "*/0", "-1", "0/15", "1,2,3", "", "99999999"]),
    st.integers(-5, 100).map(str),
    st.text(string.printable, max_size=6),
)  # fmt: skip
crons = st.one_of(
    st.lists(cron_fields, min_size=4, max_size=8).map(" ".join),
    st.sampled_from(["@daily", "@hourly", "@yearly", "@reboot", "@every 5m"]),
    any_text,
)
numbers = st.one_of(
    st.integers(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.floats(min_value=0, max_value=1e6),
    st.booleans(),
    st.none(),
    any_text,
)
offsets = st.integers(-(24 * 60 - 1), 24 * 60 - 1).map(lambda m: timezone(timedelta(minutes=m)))
moments = st.one_of(
    st.datetimes(timezones=st.one_of(offsets, st.timezones())),
    st.datetimes(),  # naive
    st.datetimes(
        min_value=datetime(2026, 1, 1), max_value=datetime(2040, 1, 1), timezones=st.just(UTC)
    ),
)
scalars = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=True), any_text)
json_values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(any_text, inner, max_size=4)
    ),
    max_leaves=30,
)
deep_lists = st.integers(1, 3000).map(lambda depth: _nested(depth))
deep_list_texts = st.integers(1, 5000).map(lambda depth: "[" * depth + "]" * depth)
header_names = st.one_of(st.sampled_from(sorted(RESERVED_HEADERS)), any_text,
                         st.from_regex(r"[a-z][a-z0-9_-]{0,10}", fullmatch=True))  # fmt: skip
option_maps = st.dictionaries(
    st.one_of(st.sampled_from(sorted(ALLOWED_OPTIONS | {"eta", "countdown", "link"})), any_text),
    st.one_of(json_values, st.dictionaries(header_names, json_values, max_size=5)),
    max_size=4,
)


def _nested(depth: int) -> list[Any]:
    value: list[Any] = []
    for _ in range(depth - 1):
        value = [value]
    return value


#: A strategy for each field of ``Schedules.create``.
FIELDS: dict[str, st.SearchStrategy[Any]] = {
    "cron": crons,
    "every": numbers,
    "at": moments,
    "in_seconds": numbers,
    "tz": zones,
    "args": st.one_of(st.lists(json_values, max_size=4), json_values, deep_lists),
    "kwargs": st.one_of(st.dictionaries(any_text, json_values, max_size=4), json_values),
    "queue": st.one_of(any_text, numbers),
    "options": st.one_of(option_maps, json_values),
    "enabled": st.one_of(st.booleans(), numbers),
    "misfire_policy": st.one_of(st.sampled_from(["fire_once", "fire_all", "skip"]), any_text),
    "overlap_policy": st.one_of(st.sampled_from(["allow", "skip", "queue_one"]), any_text),
    "max_attempts": numbers,
    "start_at": moments,
    "end_at": moments,
    "max_runs": numbers,
    "jitter": numbers,
    "allow_past": st.booleans(),
    "allow_unregistered": st.booleans(),
}
api_fields = st.fixed_dictionaries({}, optional=FIELDS)
#: One field of a definition, replaced.
mutation = st.one_of(
    *(strategy.map(lambda value, key=key: {key: value}) for key, strategy in FIELDS.items())
)


# Mostly valid definitions with a few fields drawn from the above: the accepted paths
# (first fire time, insert) are fuzzed too, not only the refusals.
VALID_CRONS = ["*/5 * * * *", "0 9 * * 1-5", "30 2 * * *", "0 0 29 2 *", "0 */5 * * * *",
               "@daily", "0 0 L * *", "0 9 1#2 * *", "5 4 * * sun", "0 0 1 1 *"]  # fmt: skip
later = st.datetimes(
    min_value=datetime(2027, 1, 1), max_value=datetime(9999, 1, 1), timezones=st.timezones()
)
valid_timing = st.one_of(
    st.fixed_dictionaries({"cron": st.sampled_from(VALID_CRONS), "tz": st.sampled_from(ZONES)}),
    st.fixed_dictionaries({"every": st.floats(1, 3e8)}),
    st.fixed_dictionaries({"in_seconds": st.floats(0, 3e8)}),
    st.fixed_dictionaries({"at": later, "tz": st.sampled_from(ZONES)}),
)
valid_extras = st.fixed_dictionaries(
    {},
    optional={
        "kwargs": st.fixed_dictionaries({"size": json_values}),
        "start_at": later,
        "end_at": later,
        "max_runs": st.integers(1, 2**31 - 1),
        "max_attempts": st.integers(1, 2**31 - 1),
        "jitter": st.floats(0, 1),
        "options": st.fixed_dictionaries(
            {},
            optional={
                "queue": st.text(string.ascii_letters, min_size=1, max_size=10),
                "priority": st.integers(0, 255),
                "expires": st.one_of(st.floats(0.001, 3e8), later.map(datetime.isoformat)),
                "headers": st.dictionaries(
                    st.from_regex(r"[a-z][a-z0-9_-]{0,10}", fullmatch=True), scalars, max_size=5
                ),
            },
        ),
    },
)


@st.composite
def nearly_valid(draw: st.DrawFn) -> dict[str, Any]:
    """A valid definition of ``tasks.demo.report`` with up to two fields replaced."""
    fields = draw(valid_timing) | draw(valid_extras)
    for _ in range(draw(st.integers(0, 2))):
        fields |= draw(mutation)
    return fields


# -- fixtures -----------------------------------------------------------------------------


@pytest.fixture
def app(test_env: SessionEnv, store: Store, redis_client: redis.Redis) -> Celery:
    return create_app(test_env.settings())


@pytest.fixture
def schedules(app: Celery) -> Iterator[Schedules]:
    manager = Schedules.for_app(app)
    yield manager
    manager.store.dispose()


def assert_written_only(store: Store, before: list[tuple[Any, ...]], name: str) -> None:
    """The tables are as ``before`` plus one schedule named ``name`` (no run); then that
    schedule is deleted, so the next example starts from the same tables."""
    with store.engine.begin() as conn:
        conn.execute(text("DELETE FROM beat_schedules WHERE name = :name"), {"name": name})
    assert table_rows(store) == before, "more was written than the schedule"


def assert_one_line(message: str) -> None:
    assert message, "an empty error"
    assert "\n" not in message, f"not one line: {message!r}"
    assert "\r" not in message, f"not one line: {message!r}"


# -- the API ------------------------------------------------------------------------------


@FUZZ
@given(
    name=names,
    task_and_fields=st.one_of(
        st.tuples(tasks, api_fields), st.tuples(st.just("tasks.demo.report"), nearly_valid())
    ),
)
def test_the_api_refuses_in_one_line_or_writes_exactly_the_schedule(
    store: Store, schedules: Schedules, name: Any, task_and_fields: tuple[Any, dict[str, Any]]
) -> None:
    task, fields = task_and_fields
    before = table_rows(store)
    try:
        created = schedules.create(name, task, **fields)
    except InvalidSchedule as exc:
        event("refused")
        assert_one_line(str(exc))
        assert table_rows(store) == before, "a refused schedule wrote something"
        return
    event("accepted")
    assert created.name == name
    assert_written_only(store, before, name)


# -- the CLI ------------------------------------------------------------------------------

CLI_VALUES = st.one_of(
    any_text.filter(lambda value: "\x00" not in value),  # argv cannot hold NUL
    st.integers(-(2**70), 2**70).map(str),
    st.floats(allow_nan=True).map(str),
    st.sampled_from(["90", "1.5", "90s", "10m", "1h30m", "2d", "0", "-1", "1e13", "4000d"]),
    moments.map(lambda moment: moment.isoformat()),
    moments.map(lambda moment: moment.isoformat(sep=" ", timespec="minutes")),
    json_values.map(json.dumps),
    st.sampled_from(ZONES),
    crons,
)
VALUE_OPTIONS = ["--cron", "--every", "--at", "--in", "--tz", "--args", "--kwargs", "--queue",
                 "--start-at", "--end-at", "--max-runs", "--jitter", "--max-attempts",
                 "--misfire-policy", "--overlap-policy"]  # fmt: skip
FLAGS = ["--paused", "--allow-past", "--allow-unregistered"]
cli_options = st.lists(
    st.one_of(
        st.tuples(st.sampled_from(VALUE_OPTIONS), CLI_VALUES),
        st.tuples(st.sampled_from(FLAGS)),
        st.tuples(st.sampled_from(["--args", "--kwargs"]), json_values.map(json.dumps)),
        st.tuples(st.just("--args"), deep_list_texts),
    ),
    max_size=6,
)


def _cli_option(key: str, value: Any) -> list[str]:
    """The CLI options that give API field ``key`` (None: the CLI has no such option)."""
    if isinstance(value, datetime):
        value = value.isoformat()
    elif isinstance(value, dict | list):
        value = json.dumps(value)
    option = {"in_seconds": "--in", "max_runs": "--max-runs", "max_attempts": "--max-attempts",
              "start_at": "--start-at", "end_at": "--end-at"}.get(key, f"--{key}")  # fmt: skip
    return [option, str(value)]


nearly_valid_cli_options = valid_timing.map(
    lambda fields: [token for key, value in fields.items() for token in _cli_option(key, value)]
)
cli_names = names.filter(lambda value: "\x00" not in value)
cli_tasks = tasks.filter(lambda value: "\x00" not in value)


@FUZZ
@given(
    name=st.one_of(valid_names, cli_names),
    task=st.one_of(cli_tasks, st.just("tasks.demo.heartbeat")),
    valid=st.one_of(st.just([]), nearly_valid_cli_options),
    options=st.one_of(st.just([]), cli_options),
)
def test_add_exits_2_with_one_line_or_writes_exactly_the_schedule(
    app: Celery,
    store: Store,
    name: str,
    task: str,
    valid: list[str],
    options: list[tuple[str, ...]],
) -> None:
    before = table_rows(store)
    extra = [token for option in options for token in option]
    args = ["add", name, task, *valid, *extra, "--json"]

    result = invoke(app, *args)  # an exception other than exit propagates: a failure

    event(f"exit {result.exit_code}")
    if result.exit_code == 2:
        assert result.stdout == ""
        assert result.stderr.startswith("Error: ")
        assert result.stderr.count("\n") == 1, f"not one line: {result.stderr!r}"
        assert table_rows(store) == before, "a refused command wrote something"
        return
    assert result.exit_code == 0, f"exit {result.exit_code}: {result.output}"
    assert json.loads(result.stdout)["name"] == name
    assert_written_only(store, before, name)
