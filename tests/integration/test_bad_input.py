"""Bad input, careless or hostile, from every entry point: the CLI, the Python API and
code schedules (``beat_schedule``). Each is refused with one line that names the fix,
exit code 2 on the command line, and nothing written (checked in the database); or
it has the behaviour the README documents.

The CLI runs in-process (Celery's own ``celery`` click group, as in ``test_cli``),
with exceptions propagating: a traceback fails the test.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
import redis
from celery import Celery
from click.testing import Result
from sqlalchemy import text

from app.factory import create_app
from beat.errors import InvalidSchedule
from beat.models import RunState
from beat.ops.schedules import Schedules
from beat.scheduler import HAScheduler
from beat.store.all_roles import Store
from tests.conftest import SessionEnv
from tests.integration.helpers import (
    as_json,
    broker_messages,
    error_lines,
    invoke,
    run_rows,
    schedule_row,
    table_rows,
)

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
def seeded(app: Celery, schedules: Schedules) -> Schedules:
    """An ``existing`` schedule made at runtime and an ``in-code`` one defined in code,
    for the commands that name one."""
    schedules.create("existing", "tasks.demo.add", every=60, args=[1, 2])
    app.conf.beat_schedule = {
        "in-code": {"task": "tasks.demo.add", "schedule": 60.0, "args": [1, 2]}
    }
    assert as_json(invoke(app, "sync", "--json"))["created"] == ["in-code"]
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


def nested(depth: int) -> list[Any]:
    """``[[[...]]]``, ``depth`` lists deep."""
    value: list[Any] = []
    for _ in range(depth - 1):
        value = [value]
    return value


DEEP = nested(5000)
DEEP_TEXT = "[" * 5000 + "]" * 5000


def add_args(name: str) -> list[str]:
    """``add NAME tasks.demo.add --args [1, 2]``: a valid start, to which a case adds."""
    return ["add", name, "tasks.demo.add", "--args", "[1, 2]"]


ADD = add_args("x")


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


# -- durations: --every, --in and --jitter take the same forms --------------------------------

DURATIONS = [("90", 90), ("1.5", 1.5), ("90s", 90), ("10m", 600), ("1h30m", 5400), ("1d", 86400)]


@pytest.mark.parametrize(("given", "seconds"), DURATIONS)
def test_every_in_and_jitter_take_plain_seconds_and_units_alike(
    app: Celery, store: Store, given: str, seconds: float
) -> None:
    task = ["tasks.demo.add", "--args", "[1, 2]"]
    interval = as_json(invoke(app, "add", "every", *task, "--every", given, "--json"))
    assert interval["schedule"] == f"every {seconds:g}s"

    as_json(invoke(app, "add", "one-off", *task, "--in", given, "--json"))
    row = schedule_row(store, "one-off")
    assert row.next_fire_at == row.created_at + timedelta(seconds=seconds)

    hourly = ["--cron", "0 * * * *", "--jitter", given, "--json"]
    assert as_json(invoke(app, "add", "jittered", *task, *hourly))["jitter_seconds"] == seconds


# -- the table: every bad input from the command line ----------------------------------------


CLI_REFUSALS = [
    # durations
    pytest.param([*ADD, "--every", "10x"], "not a duration", id="every-not-a-duration"),
    pytest.param([*ADD, "--every", "1e13"], "not a duration", id="every-exponent"),
    pytest.param([*ADD, "--every", "4000d"], "3650 days", id="every-over-ten-years"),
    pytest.param([*ADD, "--every", "0"], ">= 1", id="every-zero"),
    pytest.param([*ADD, "--in", "-5"], "not a duration", id="in-negative"),
    pytest.param([*ADD, "--in", "100000000000000000000s"], "3650 days",
                 id="in-overflow"),
    pytest.param([*ADD, "--cron", "0 * * * *", "--jitter", "2d"], "86400", id="jitter-over-a-day"),
    pytest.param(["prune", "--older-than", "100000000000000000000d"], "3650 days",
                 id="prune-overflow"),
    pytest.param(["prune", "--older-than", "30"], "not a duration", id="prune-without-unit"),
    # times
    pytest.param([*ADD, "--at", "0001-01-01T00:00:00+14:00"], "years 1 to 9999",
                 id="at-before-year-1-in-utc"),
    pytest.param([*ADD, "--at", "9999-12-31T23:59:00-12:00"], "years 1 to 9999",
                 id="at-after-year-9999-in-utc"),
    pytest.param([*ADD, "--at", "0001-01-01T00:00", "--tz", "Asia/Tokyo"], "years 1 to 9999",
                 id="naive-at-before-year-1-in-utc"),
    pytest.param([*ADD, "--at", "2027-03-28T02:30", "--tz", "Europe/Berlin"],
                 "does not exist in Europe/Berlin", id="at-skipped-by-dst"),
    pytest.param([*ADD, "--at", "2027-10-31T02:30", "--tz", "Europe/Berlin"],
                 "2027-10-31T02:30:00+02:00 or 2027-10-31T02:30:00+01:00", id="at-twice-by-dst"),
    pytest.param([*ADD, "--every", "60", "--start-at", "tomorrow"], "ISO 8601",
                 id="start-at-not-a-time"),
    pytest.param(["update", "existing", "--at", "2027-03-28T02:30", "--tz", "Europe/Berlin"],
                 "does not exist in Europe/Berlin", id="update-at-skipped-by-dst"),
    pytest.param(["update", "nope", "--at", "2030-01-01T00:00"], "no schedule named 'nope'",
                 id="update-unknown-with-naive-at"),
    # zones
    pytest.param([*ADD, "--every", "60", "--tz", "Europe/Berlin"], "has no time zone",
                 id="interval-with-zone"),
    pytest.param(["update", "existing", "--tz", "Europe/Berlin"], "has no time zone",
                 id="update-interval-with-zone"),
    pytest.param([*ADD, "--cron", "0 * * * *", "--tz", ""], "unknown time zone ''",
                 id="empty-zone"),
    # names of schedules
    pytest.param(["runs", "nosuch"], "no schedule or run history named 'nosuch'",
                 id="runs-unknown"),
    pytest.param(["runs", "two\nlines"], "'two\\nlines'", id="runs-unknown-newline"),
    pytest.param(["show", "two\nlines"], "'two\\nlines'", id="show-unknown-newline"),
    pytest.param(["update", "existing", "--task", "two\nlines"], "'two\\nlines'",
                 id="update-task-newline"),
    pytest.param([*ADD, "--every", "60", "--misfire-policy", "two\nlines"], "two\\nlines",
                 id="choice-newline"),
    pytest.param(["add", "x", "tasks.demo.add", "--every", "60", "--two\nlines"], "--two",
                 id="usage-option-newline"),
    pytest.param(["remove", "in-code"], "is defined in code", id="remove-code-schedule"),
    # names, numbers and JSON
    pytest.param(["add", "nightly\n", "tasks.demo.add", "--args", "[1, 2]", "--every", "60"],
                 "schedule name 'nightly\\n'", id="name-trailing-newline"),
    pytest.param(["add", "x", "tasks.demo.add\x07", "--args", "[1, 2]", "--every", "60"],
                 "control characters", id="task-control-character"),
    pytest.param(["add", "x", "tasks.demo.add", "--every", "60", "--args", DEEP_TEXT],
                 "nested too deeply", id="args-nested-5000-deep"),
    pytest.param(["add", "x", "tasks.demo.add", "--every", "60", "--args", "[1, " + "[" * 40 +
                  "]" * 40 + "]"], "nested more than 32 levels", id="args-nested-41-deep"),
    pytest.param(["add", "x", "tasks.demo.add", "--every", "60", "--args", '["a\\u0000b", 2]'],
                 "NUL", id="args-nul-character"),
    pytest.param([*ADD, "--every", "60", "--max-runs", "1099511627776"], "2147483647",
                 id="max-runs-over-column"),
    pytest.param([*ADD, "--every", "60", "--max-attempts", "2147483648"], "2147483647",
                 id="max-attempts-over-column"),
    pytest.param(["update", "existing", "--max-runs", "1099511627776"], "2147483647",
                 id="update-max-runs-over-column"),
    pytest.param([*ADD, "--every", "60", "--jitter", "61"], "longer than its interval",
                 id="jitter-over-interval"),
    # run monitors
    pytest.param([*ADD, "--every", "60", "--missed-after", "-5"], "'-5' is not a duration",
                 id="missed-after-negative"),
    pytest.param([*ADD, "--every", "60", "--late-after", "soon"], "--late-after",
                 id="late-after-word"),
    pytest.param([*ADD, "--every", "60", "--max-runtime", "0.5"], "max_runtime must be a number"
                 " of seconds >= 1", id="max-runtime-under-a-second"),
    pytest.param([*ADD, "--every", "60", "--failure-states", "failed,stalled"],
                 "'stalled' is not an outcome counted as a failure: give some of failed, lost,"
                 " expired", id="failure-states-unknown"),
    pytest.param([*ADD, "--every", "60", "--revoke-after-max-runtime"],
                 "revoke_after_max_runtime needs a max_runtime: give one (--max-runtime SECONDS)",
                 id="revoke-without-max-runtime"),
    pytest.param(["update", "existing", "--max-runtime", "4000d"], "at most 315360000",
                 id="update-max-runtime-over-ten-years"),
    pytest.param(["backfill", "existing", "--from", "2026-01-01T00:00:00+00:00", "--to",
                  "2026-01-02T00:00:00+00:00", "--limit", "1000000"], "10000",
                 id="backfill-limit-over-maximum"),
    pytest.param(["runs", "--limit", "99999999999999999999"], "1<=x<=10000",
                 id="runs-limit-over-bigint"),
    # publish options (the CLI sets only the queue)
    pytest.param([*ADD, "--every", "60", "--queue", ""], "options.queue", id="queue-empty"),
    pytest.param([*ADD, "--every", "60", "--queue", "re\nports"], "control characters",
                 id="queue-control-character"),
    # crons
    pytest.param([*ADD, "--cron", "*/5 * * * * 30"], "read seconds first", id="six-fields"),
    # arguments that the task's signature does not take
    pytest.param(["add", "x", "tasks.demo.add", "--every", "60"],
                 "missing a required argument: 'x'", id="args-missing"),
    pytest.param([*ADD, "--every", "60", "--kwargs", '{"z": 1}'],
                 "unexpected keyword argument 'z'", id="kwargs-unknown"),
    pytest.param(["add", "x", "tasks.demo.add", "--args", "[1, 2, 3]", "--every", "60"],
                 "too many positional arguments", id="args-too-many"),
    pytest.param(["update", "existing", "--args", "[1]"], "missing a required argument: 'y'",
                 id="update-args-missing"),
    pytest.param(["update", "existing", "--task", "tasks.demo.report"],
                 "too many positional arguments", id="update-task-takes-other-args"),
]  # fmt: skip


@pytest.mark.parametrize(("args", "says"), CLI_REFUSALS)
def test_bad_input_on_the_command_line_is_one_line_exit_2_and_writes_nothing(
    app: Celery, store: Store, seeded: Schedules, args: list[str], says: str
) -> None:
    assert says in refused(app, store, *args)


# -- the table: every bad input through the Python API --------------------------------------

PLUS_14 = timezone(timedelta(hours=14))
MINUS_12 = timezone(-timedelta(hours=12))

API_REFUSALS = [
    pytest.param({"every": 10**400}, "at most 315360000 (3650 days)", id="every-huge-int"),
    pytest.param({"every": 1e13}, "at most 315360000 (3650 days)", id="every-never-fires"),
    pytest.param({"in_seconds": 1e20}, "at most 315360000 (3650 days)", id="in-overflow"),
    pytest.param({"at": datetime.min.replace(tzinfo=PLUS_14)}, "years 1 to 9999",
                 id="at-before-year-1-in-utc"),
    pytest.param({"cron": "* * * * *", "end_at": datetime.max.replace(tzinfo=MINUS_12)},
                 "years 1 to 9999", id="end-at-after-year-9999-in-utc"),
    pytest.param({"every": 60, "tz": "Europe/Berlin"}, "has no time zone",
                 id="interval-with-zone"),
    pytest.param({"cron": "0 * * * *", "tz": ""}, "unknown time zone ''", id="empty-zone"),
    pytest.param({"cron": "*/5 * * * * 30"}, "second minute hour day month weekday",
                 id="six-fields"),
    # names, numbers and JSON
    pytest.param({"every": 60, "args": DEEP}, "nested more than 32 levels", id="args-deep"),
    pytest.param({"every": 60, "kwargs": {"x": DEEP}}, "nested more than 32 levels",
                 id="kwargs-deep"),
    pytest.param({"every": 60, "args": ["a\x00b", 2]}, "NUL", id="args-nul"),
    pytest.param({"every": 60, "args": [1, 2], "kwargs": {"\ud800": 1}}, "UTF-8",
                 id="kwargs-lone-surrogate"),
    pytest.param({"every": 60, "max_runs": 2**40}, "2147483647", id="max-runs-over-column"),
    pytest.param({"every": 60, "max_attempts": 2**31}, "2147483647",
                 id="max-attempts-over-column"),
    pytest.param({"every": 60, "max_attempts": True}, "max_attempts", id="max-attempts-bool"),
    pytest.param({"every": 60, "enabled": "no"}, "enabled must be true or false",
                 id="enabled-a-string"),
    pytest.param({"every": 60, "jitter": 61}, "longer than its interval", id="jitter-over-every"),
    pytest.param({"every": 60, "missed_after": -1}, "missed_after must be a number of seconds",
                 id="missed-after-negative"),
    pytest.param({"every": 60, "late_after": float("nan")}, "late_after must be a number",
                 id="late-after-nan"),
    pytest.param({"every": 60, "failure_states": []}, "failure_states must be a list of some",
                 id="failure-states-empty"),
    pytest.param({"every": 60, "max_runtime": "10m"}, "max_runtime must be a number",
                 id="max-runtime-a-string"),
    pytest.param({"every": 60, "max_runtime": 60, "revoke_after_max_runtime": "yes"},
                 "revoke_after_max_runtime must be true or false", id="revoke-a-string"),
    pytest.param({"every": 60, "name": "tab\tname"}, "schedule name", id="name-with-tab"),
    pytest.param({"every": 60, "task": "tasks.\x00add"}, "control characters", id="task-nul"),
    # publish options: what reaches Celery's message
    *(pytest.param({"every": 60, "options": options}, says, id=f"options-{case}")
      for case, options, says in [
        ("header-task", {"headers": {"task": "celery.backend_cleanup"}}, "'task' is read by"),
        ("header-eta", {"headers": {"eta": "2030-01-01T00:00:00+00:00"}}, "'eta' is read by"),
        ("header-id", {"headers": {"id": "x"}}, "'id' is read by"),
        ("header-case", {"headers": {"Task": "celery.backend_cleanup"}}, "'Task' is read by"),
        ("header-ours", {"headers": {"habeat_attempt": 9}}, "habeat_"),
        ("header-broker", {"headers": {"x-delay": 5000}}, "x-"),
        ("header-name", {"headers": {"two words": 1}}, "letters, digits"),
        ("header-object", {"headers": {"trace": {"a": 1}}}, "a string, number, true"),
        ("header-huge", {"headers": {"blob": "x" * 5000}}, "4096 bytes"),
        ("header-too-many", {"headers": {f"h{i}": i for i in range(40)}}, "at most 32"),
        ("headers-not-object", {"headers": "oops"}, "options.headers must be a JSON object"),
        ("priority-word", {"priority": "high"}, "options.priority must be a whole number"),
        ("priority-256", {"priority": 256}, "0 to 255"),
        ("priority-bool", {"priority": True}, "options.priority"),
        ("queue-number", {"queue": 5}, "options.queue must be a name"),
        ("exchange-long", {"exchange": "e" * 256}, "255 characters"),
        ("eta", {"eta": "2030-01-01T00:00:00+00:00"}, "never eta/countdown"),
        ("countdown", {"countdown": 10}, "never eta/countdown"),
        ("unknown", {"link": "tasks.demo.add"}, "unsupported publish option(s) link"),
        ("expires-word", {"expires": "soon"}, "options.expires"),
        ("expires-naive", {"expires": "2030-01-01T00:00:00"}, "UTC offset"),
        ("expires-huge", {"expires": 1e300}, "3650 days"),
        ("expires-zero", {"expires": 0}, "options.expires"),
        ("not-an-object", "q", "options must be a JSON object"),
        ("key-newline", {"two\nlines": {}}, "unsupported publish option(s) two\\nlines"),
    ]),
]  # fmt: skip


@pytest.mark.parametrize(("fields", "says"), API_REFUSALS)
def test_bad_input_through_the_api_raises_one_line_and_writes_nothing(
    store: Store, seeded: Schedules, fields: dict[str, Any], says: str
) -> None:
    before = table_rows(store)
    fields = {"args": [1, 2], **fields}
    with pytest.raises(InvalidSchedule) as caught:
        seeded.create(fields.pop("name", "x"), fields.pop("task", "tasks.demo.add"), **fields)
    assert says in str(caught.value)
    assert "\n" not in str(caught.value)
    assert table_rows(store) == before


# -- times without an offset are read in --tz, else the default zone -------------------------


def next_year(store: Store) -> int:
    return store.now().year + 1


def test_a_time_without_offset_is_read_in_the_tz_given(app: Celery, store: Store) -> None:
    year = next_year(store)
    as_json(
        invoke(
            app, *add_args("eve"), "--at", f"{year}-12-24 18:00", "--tz", "Europe/Berlin", "--json"
        )
    )
    assert schedule_row(store, "eve").run_at == datetime(year, 12, 24, 17, 0, tzinfo=UTC)

    window = ["--start-at", f"{year}-07-01T09:00", "--end-at", f"{year}-07-31 18:00"]
    as_json(
        invoke(
            app, *add_args("summer"), "--cron", "0 9 * * *", "--tz", "Asia/Tokyo", *window, "--json"
        )
    )
    row = schedule_row(store, "summer")
    assert (row.start_at, row.end_at) == (
        datetime(year, 7, 1, 0, 0, tzinfo=UTC),
        datetime(year, 7, 31, 9, 0, tzinfo=UTC),
    )
    as_json(invoke(app, "update", "summer", "--end-at", f"{year}-08-31 18:00", "--json"))
    assert schedule_row(store, "summer").end_at == datetime(year, 8, 31, 9, 0, tzinfo=UTC), (
        "update reads it in the schedule's own zone"
    )


def test_a_time_without_offset_or_tz_is_read_in_the_default_zone(
    test_env: SessionEnv, store: Store, redis_client: redis.Redis
) -> None:
    app = create_app(test_env.settings(timezone="America/New_York"))
    year = next_year(store)
    as_json(invoke(app, *add_args("new-year"), "--at", f"{year}-01-01T00:00", "--json"))
    assert schedule_row(store, "new-year").run_at == datetime(year, 1, 1, 5, 0, tzinfo=UTC)
    with_offset = f"{year}-01-01T00:00:00+00:00"
    as_json(invoke(app, *add_args("utc"), "--at", with_offset, "--tz", "Asia/Tokyo", "--json"))
    assert schedule_row(store, "utc").run_at == datetime(year, 1, 1, tzinfo=UTC), (
        "an offset given wins over --tz"
    )


def test_a_one_off_in_the_past_is_refused_unless_allowed(
    app: Celery, store: Store, schedules: Schedules
) -> None:
    hour_ago = (store.now() - timedelta(hours=1)).isoformat()
    line = refused(app, store, *add_args("late"), "--at", hour_ago)
    assert "in the past" in line
    assert "--allow-past" in line
    with pytest.raises(InvalidSchedule, match="allow_past"):
        schedules.create("late", "tasks.demo.add", args=[1, 2], at=datetime.fromisoformat(hour_ago))
    assert table_rows(store) == []

    allowed = as_json(invoke(app, *add_args("late"), "--at", hour_ago, "--allow-past", "--json"))
    assert allowed["next_fire_at"] == hour_ago, "it fires once, at once"
    just_now = store.now() - timedelta(seconds=5)
    created = schedules.create("now", "tasks.demo.add", args=[1, 2], at=just_now)
    assert created.next_fire_at == just_now, "a minute of clock skew is not the past"
    as_json(
        invoke(app, "update", "late", "--kwargs", "{}", "--json")
    )  # its own time is not re-checked
    line = refused(app, store, "update", "late", "--at", hour_ago)
    assert "--allow-past" in line


# -- arguments are checked against the task's signature --------------------------------------


def test_arguments_of_a_bound_task_are_checked_without_its_self(
    app: Celery, store: Store, schedules: Schedules
) -> None:
    @app.task(bind=True, name="tests.bound")
    def bound(self: Any, label: str, *, times: int = 1) -> str:
        return label * times

    created = schedules.create("bound", "tests.bound", every=60, args=["a"], kwargs={"times": 2})
    assert created.definition.args == ("a",)
    bound_signature = r"tests\.bound\(label, \*, times=1\)"
    with pytest.raises(InvalidSchedule, match=bound_signature):
        schedules.create("unbound", "tests.bound", every=60, args=["a", 2])
    assert [s.name for s in schedules.list()] == ["bound"]


def test_allow_unregistered_also_skips_the_argument_check(app: Celery, store: Store) -> None:
    """For workers that run another version of the task than this app knows."""
    command = ["add", "newer", "tasks.demo.add", "--every", "60", "--allow-unregistered"]
    assert as_json(invoke(app, *command, "--args", "[1, 2, 3]", "--json"))["args"] == [1, 2, 3]


def test_a_code_schedule_of_an_unknown_task_or_with_wrong_arguments_is_synced_with_a_warning(
    app: Celery,
    store: Store,
    make_scheduler: Callable[..., HAScheduler],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Beat publishes by name and need not import the workers' code: a task it does not
    know, or whose signature it sees differently, may be right for the workers."""
    code = {
        "typo": {"task": "tasks.demo.ad", "schedule": 60.0},
        "no-args": {"task": "tasks.demo.add", "schedule": 60.0},
        "fine": {"task": "tasks.demo.add", "schedule": 60.0, "args": [1, 2]},
    }
    app.conf.beat_schedule = code

    result = invoke(app, "sync")

    assert result.exit_code == 0, result.output
    warnings = sorted(line for line in result.stderr.splitlines() if line.startswith("Warning:"))
    assert len(warnings) == 2, result.stderr
    assert "code schedule no-args: task tasks.demo.add(x, y) cannot take" in warnings[0]
    assert "missing a required argument: 'x'" in warnings[0]
    assert "code schedule typo: task 'tasks.demo.ad' is not registered" in warnings[1]
    assert {row[0] for row in table_rows(store)} == {1, 2, 3}, "all three are synced"

    with caplog.at_level(logging.WARNING, logger="beat.scheduler"):
        make_scheduler({"beat_schedule": code})
    logged = [r.getMessage() for r in caplog.records if r.name == "beat.scheduler"]
    assert sorted(logged) == [line.removeprefix("Warning: ") for line in warnings]


# -- the table: every bad input in code (beat_schedule entries) ------------------------------

CODE_REFUSALS = [
    pytest.param({"schedule": 60.0, "tz": "Europe/Berlin"}, "has no time zone",
                 id="interval-with-zone"),
    pytest.param({"schedule": 60.0, "options": {"headers": {"task": "celery.backend_cleanup"}}},
                 "'task' is read by", id="header-task"),
    pytest.param({"schedule": 60.0, "options": "q"}, "options must be a JSON object",
                 id="options-not-an-object"),
    pytest.param({"schedule": 60.0, "enabled": "no"}, "enabled must be true or false",
                 id="enabled-a-string"),
    pytest.param({"schedule": 60.0, "args": "12"}, "args must be a JSON array",
                 id="args-a-string"),
    pytest.param({"schedule": 60.0, "kwargs": [["x", 1]]}, "kwargs must be a JSON object",
                 id="kwargs-pairs"),
    pytest.param({"schedule": 60.0, "max_runs": 2**40}, "2147483647", id="max-runs-huge"),
    pytest.param({"schedule": 60.0, "late_after": 0}, "late_after must be a number of seconds",
                 id="late-after-zero"),
    pytest.param({"schedule": 60.0, "two\nlines": 1}, "unknown key(s) two\\nlines",
                 id="unknown-key-newline"),
]  # fmt: skip


@pytest.mark.parametrize(("entry", "says"), CODE_REFUSALS)
def test_bad_input_in_code_stops_sync_and_beat_with_one_line_and_writes_nothing(
    app: Celery,
    store: Store,
    seeded: Schedules,
    make_scheduler: Callable[..., HAScheduler],
    entry: dict[str, Any],
    says: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    app.conf.beat_schedule = {"bad": {"task": "tasks.demo.add", "args": [1, 2], **entry}}

    line = refused(app, store, "sync")

    assert line.startswith("Error: beat_schedule['bad']: ")
    assert says in line
    with (
        caplog.at_level(logging.CRITICAL, logger="beat.scheduler"),
        pytest.raises(SystemExit) as stopped,
    ):
        make_scheduler({"beat_schedule": app.conf.beat_schedule})
    assert stopped.value.code == 2
    (record,) = [r for r in caplog.records if r.levelno == logging.CRITICAL]
    assert says in record.getMessage()
    assert "\n" not in record.getMessage()


def test_an_interval_in_code_is_stored_with_the_app_zone_without_being_refused(
    test_env: SessionEnv, store: Store, redis_client: redis.Redis
) -> None:
    app = create_app(test_env.settings(timezone="Europe/Berlin"))
    app.conf.beat_schedule = {"tick": {"task": "tasks.demo.add", "schedule": 60, "args": [1, 2]}}
    assert as_json(invoke(app, "sync", "--json"))["created"] == ["tick"]
    assert schedule_row(store, "tick").timezone == "Europe/Berlin"


def test_a_schedule_defined_in_code_is_not_removed_at_runtime(
    store: Store, seeded: Schedules
) -> None:
    """The next sync would bring it back: the fix is in the code, or a pause."""
    with pytest.raises(InvalidSchedule, match=r"remove it from the code.*or pause it"):
        seeded.delete("in-code")
    assert seeded.get("in-code").definition.enabled


def test_runs_of_a_removed_schedule_are_still_listed_by_name(
    app: Celery, seeded: Schedules
) -> None:
    seeded.trigger("existing")
    seeded.delete("existing")
    [run] = as_json(invoke(app, "runs", "existing", "--json"))
    assert run["schedule"] == "existing"
    assert as_json(invoke(app, "runs", "existing", "--state", "failed", "--json")) == []
    assert as_json(invoke(app, "runs", "in-code", "--json")) == [], "no runs yet, but it exists"


# -- publish options: the allowed ones reach the message, bad rows are quarantined -----------


Messages = list[dict[str, Any]]


@pytest.fixture
def tick_and_read(
    make_scheduler: Callable[..., HAScheduler], redis_client: redis.Redis, test_env: SessionEnv
) -> Callable[[str], Messages]:
    """Lead and tick once; then the messages waiting in a queue of the broker."""

    def tick(queue: str) -> Messages:
        make_scheduler().tick()
        return broker_messages(redis_client, test_env.broker_key_prefix, queue)

    return tick


def test_allowed_options_and_headers_reach_the_message(
    schedules: Schedules, tick_and_read: Callable[[str], Messages]
) -> None:
    options = {
        "headers": {"tenant": "acme", "trace-id": 7, "sampled": True},
        "priority": 3,
        "expires": "2099-01-01T00:00:00+00:00",
    }
    schedules.create("tagged", "tasks.demo.add", args=[1, 2], in_seconds=0, options=options)

    # kombu's Redis transport keeps priority 3 in a list of its own.
    [message] = tick_and_read("celery\x06\x163")
    headers = message["headers"]
    assert (headers["tenant"], headers["trace-id"], headers["sampled"]) == ("acme", 7, True)
    assert headers["task"] == "tasks.demo.add"
    assert headers["expires"].startswith("2099-01-01T00:00:00")
    assert message["properties"]["priority"] == 3


def psql(store: Store, statement: str, **params: Any) -> None:
    """Write as an operator would with psql: around every check of the API."""
    with store.engine.begin() as conn:
        conn.execute(text(statement), params)


#: A schedule due now.
INSERT_SCHEDULE = (
    "INSERT INTO beat_schedules (name, task, trigger_kind, every_seconds, anchor_at,"
    " next_fire_at, args, options) VALUES (:name, 'tasks.demo.add', 'every', 60, now(), now(),"
    " '[1, 2]', CAST(:options AS jsonb))"
)
#: A run of schedule :name waiting in the outbox.
INSERT_PENDING_RUN = (
    "INSERT INTO beat_runs (id, schedule_id, schedule_name, task, args, options, fire_at, state)"
    " SELECT gen_random_uuid(), id, name, task, args, CAST(:options AS jsonb), now(), 'pending'"
    " FROM beat_schedules WHERE name = :name"
)


def test_a_row_written_with_psql_that_overrides_a_header_is_quarantined_and_others_publish(
    store: Store, schedules: Schedules, tick_and_read: Callable[[str], Messages]
) -> None:
    override = json.dumps({"headers": {"task": "celery.backend_cleanup"}})
    psql(store, INSERT_SCHEDULE, name="hostile-schedule", options=override)
    schedules.create("queued-hostile", "tasks.demo.add", every=3600, args=[1, 2])
    psql(store, INSERT_PENDING_RUN, name="queued-hostile", options='{"priority": "high"}')
    schedules.create("good", "tasks.demo.add", args=[1, 2], in_seconds=0)

    messages = tick_and_read("celery")
    assert [message["headers"]["habeat_schedule"] for message in messages] == ["good"]
    assert {message["headers"]["task"] for message in messages} == {"tasks.demo.add"}
    for name, says in [
        ("hostile-schedule", "'task' is read by"),
        ("queued-hostile", "options.priority must be a whole number"),
    ]:
        row = schedule_row(store, name)
        assert (row.enabled, row.quarantined_at is not None) == (False, True)
        assert says in row.disabled_reason
    [failed] = [row for row in run_rows(store) if row.schedule_name == "queued-hostile"]
    assert failed.state == RunState.FAILED.value
    assert "options.priority" in failed.error


def test_a_header_override_is_refused_by_update_too(store: Store, seeded: Schedules) -> None:
    before = table_rows(store)
    with pytest.raises(InvalidSchedule, match="'task' is read by"):
        seeded.update("existing", options={"headers": {"task": "celery.backend_cleanup"}})
    assert table_rows(store) == before


def test_backfill_refuses_more_fire_times_than_its_maximum_and_writes_nothing(
    app: Celery, store: Store, schedules: Schedules
) -> None:
    """A day of a one-second schedule made 86,401 runs in one go (363 MB in the CLI)."""
    now = store.now()
    two_days_ago = now - timedelta(days=2)
    schedules.create("per-second", "tasks.demo.add", every=1, start_at=two_days_ago, args=[1, 2])
    day = ["--from", (now - timedelta(days=1)).isoformat(), "--to", now.isoformat()]
    line = refused(app, store, "backfill", "per-second", *day, "--limit", "10000")
    assert "more than 10000 fire times" in line
    with pytest.raises(
        InvalidSchedule, match="backfill limit must be a whole number from 1 to 10000"
    ):
        schedules.backfill("per-second", start=now - timedelta(days=1), end=now, limit=10**6)


@pytest.mark.parametrize("task", [["tasks.demo.add"], 5, "", "tasks.demo.add\n"])
def test_update_refuses_a_task_that_is_no_task_name_before_looking_it_up(
    store: Store, seeded: Schedules, task: Any
) -> None:
    before = table_rows(store)
    with pytest.raises(InvalidSchedule, match="task"):
        seeded.update("existing", task=task)
    assert table_rows(store) == before
