"""Pure validation of what people type: durations and wall times on the command line,
and the bounds ``define`` puts on a schedule. Each refusal is one line naming the fix."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

import pytest

from beat.errors import InvalidSchedule, one_line
from beat.limits import MAX_DURATION, MAX_INT4
from beat.ops.schedules import MAX_JSON_DEPTH
from beat.ops.user_input import duration_seconds, parse_duration, wall_time_in
from beat.schedule.define import PAST_ONE_OFF_GRACE, arguments_problem, define

NOW = datetime(2026, 12, 3, 12, 0, tzinfo=UTC)
BERLIN = ZoneInfo("Europe/Berlin")


def refusal(**fields: Any) -> str:
    """The message of ``define``'s refusal of ``fields`` (an interval by default)."""
    with pytest.raises(InvalidSchedule) as caught:
        define(fields.pop("name", "n"), fields.pop("task", "t"), now=NOW, **fields)
    message = str(caught.value)
    assert "\n" not in message
    return message


# -- durations ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("90", 90), ("1.5", 1.5), (" 90s ", 90), ("10M", 600), ("1h30m", 5400), ("2d", 172800),
     ("1w1d", 691200), ("0", 0)],
)  # fmt: skip
def test_durations_are_plain_seconds_or_units(text: str, seconds: float) -> None:
    assert duration_seconds(text) == seconds


@pytest.mark.parametrize("text", ["", "1e13", "-5", "10x", "h", "1.", ".5", "1 h", "inf", "nan"])
def test_what_is_not_a_duration(text: str) -> None:
    with pytest.raises(ValueError, match="is not a duration"):
        duration_seconds(text)


def test_a_duration_that_deletes_needs_a_unit_and_a_bound() -> None:
    assert parse_duration("30d") == timedelta(days=30)
    with pytest.raises(ValueError, match="not a duration"):
        parse_duration("30")  # seconds or days? prune would delete by it
    with pytest.raises(ValueError, match="zero"):
        parse_duration("0s")
    assert parse_duration(f"{MAX_DURATION.days}d") == MAX_DURATION
    with pytest.raises(ValueError, match=f"longer than {MAX_DURATION.days} days"):
        parse_duration(f"{MAX_DURATION.days}d1s")
    with pytest.raises(ValueError, match="longer than"):
        parse_duration("9" * 400 + "d")  # float('inf') days: no OverflowError


# -- wall times ----------------------------------------------------------------------------


def test_a_wall_time_is_read_in_its_zone() -> None:
    moment = wall_time_in(datetime(2027, 7, 1, 9, 0), BERLIN, "--at")
    assert moment.astimezone(UTC) == datetime(2027, 7, 1, 7, 0, tzinfo=UTC)


def test_a_wall_time_the_clocks_skip_or_show_twice_is_refused() -> None:
    with pytest.raises(InvalidSchedule, match="does not exist in Europe/Berlin"):
        wall_time_in(datetime(2027, 3, 28, 2, 30), BERLIN, "--at")
    with pytest.raises(InvalidSchedule, match=r"\+02:00 or 2027-10-31T02:30:00\+01:00"):
        wall_time_in(datetime(2027, 10, 31, 2, 30), BERLIN, "--start-at")


def test_a_wall_time_past_the_calendar_in_utc_is_refused() -> None:
    with pytest.raises(InvalidSchedule, match="years 1 to 9999"):
        wall_time_in(datetime(1, 1, 1), ZoneInfo("Asia/Tokyo"), "--at")
    with pytest.raises(InvalidSchedule, match="years 1 to 9999"):
        wall_time_in(datetime(9999, 12, 31, 23), ZoneInfo("America/Los_Angeles"), "--end-at")


# -- define's bounds -------------------------------------------------------------------------


def nested(depth: int) -> list[Any]:
    value: list[Any] = []
    for _ in range(depth - 1):
        value = [value]
    return value


def test_nesting_is_bounded_without_recursion() -> None:
    assert define("n", "t", every=60, args=nested(MAX_JSON_DEPTH))
    assert "nested more than 32 levels" in refusal(every=60, args=nested(MAX_JSON_DEPTH + 1))
    assert "nested more than" in refusal(every=60, kwargs={"k": nested(100_000)})
    looped: list[Any] = []
    looped.append(looped)
    assert "nested more than" in refusal(every=60, args=looped)


@pytest.mark.parametrize("field", ["max_runs", "max_attempts"])
def test_counts_fit_their_integer_column(field: str) -> None:
    assert define("n", "t", every=60, **{field: MAX_INT4})  # type: ignore[arg-type]
    assert str(MAX_INT4) in refusal(every=60, **{field: MAX_INT4 + 1})
    assert field in refusal(every=60, **{field: True})


def test_a_jitter_is_at_most_a_day_and_at_most_its_interval() -> None:
    assert define("n", "t", every=60, jitter=60).jitter_seconds == 60
    assert "longer than its interval 60s" in refusal(every=60, jitter=60.5)
    assert define("n", "t", cron="0 0 * * *", jitter=86400).jitter_seconds == 86400
    assert "(a day)" in refusal(cron="0 0 * * *", jitter=86400.5)
    assert "jitter" in refusal(every=60, jitter=float("nan"))


@pytest.mark.parametrize(
    ("fields", "says"),
    [
        ({"name": "nightly\n"}, "schedule name 'nightly\\n'"),
        ({"name": "a\x00b"}, "schedule name"),
        ({"task": "tasks.a\x1bb"}, "control characters"),
        ({"task": "t" * 256}, "over 255 characters"),
        ({"args": ["\x00"]}, "NUL"),
        ({"kwargs": {"\udc80": 1}}, "not UTF-8"),
        ({"enabled": "no"}, "enabled must be true or false"),
        ({"enabled": 1}, "enabled must be true or false"),
        ({"tz": "Europe/Berlin"}, "has no time zone"),
        ({"every": 10**400}, "3650 days"),
        ({"every": float("inf")}, "3650 days"),
    ],
)
def test_what_define_refuses(fields: dict[str, Any], says: str) -> None:
    assert says in refusal(**({"every": 60} | fields))


def test_an_empty_zone_is_refused_not_defaulted() -> None:
    assert "unknown time zone ''" in refusal(cron="0 * * * *", tz="", default_tz="UTC")


def test_a_one_off_in_the_past_beyond_a_minute_needs_allowing() -> None:
    just_now = NOW - PAST_ONE_OFF_GRACE
    assert define("n", "t", at=just_now, now=NOW)
    earlier = just_now - timedelta(microseconds=1)
    assert "--allow-past" in refusal(at=earlier)
    assert define("n", "t", at=earlier, now=NOW, allow_past=True)


def test_a_bad_six_field_cron_says_the_seconds_come_first() -> None:
    message = refusal(cron="0 12 * * 1-5 30")
    assert "six fields are read seconds first: second minute hour day month weekday" in message
    assert "six fields are read" not in refusal(cron="0 12 * * 8")


# -- arguments and the task's signature --------------------------------------------------------


class BoundTask:
    """What Celery makes of ``@app.task(bind=True)``: ``run`` is bound to the task."""

    def run(self, label: str, *, times: int = 1) -> str:
        return label * times


@pytest.mark.parametrize(
    ("args", "kwargs", "problem"),
    [
        (["a"], {}, None),
        (["a"], {"times": 2}, None),
        ([], {}, "missing a required argument: 'label'"),
        (["a", 2], {}, "too many positional arguments"),
        (["a"], {"self": 1}, "unexpected keyword argument 'self'"),
    ],
)
def test_arguments_are_bound_to_the_signature_without_self(
    args: list[Any], kwargs: dict[str, Any], problem: str | None
) -> None:
    definition = define("n", "tests.bound", every=60, args=args, kwargs=kwargs, now=NOW)
    found = arguments_problem(BoundTask(), definition)
    if problem is None:
        assert found is None
    else:
        assert found is not None
        assert problem in found
        assert "tests.bound(label, *, times=1)" in found


def test_a_task_without_a_readable_signature_is_not_checked() -> None:
    definition = define("n", "t", every=60, args=[1, 2, 3], now=NOW)

    class BuiltinTask:
        run = max  # a C function whose signature inspect cannot read

    assert arguments_problem(BuiltinTask(), definition) is None
    assert arguments_problem(None, definition) is None


# -- one line, whatever was typed ------------------------------------------------------------


@pytest.mark.parametrize("line_break", ["\n", "\r", "\x0b", "\x0c", "\x1c", "\x85", "\u2028"])
def test_an_error_quoting_a_line_break_stays_one_line(line_break: str) -> None:
    error = InvalidSchedule(f"unsupported publish option(s) a{line_break}b: use queue")
    assert str(error).splitlines() == [str(error)]
    assert repr(line_break)[1:-1] in str(error)
    assert one_line("déjà vu: 'Europe/Zürich'") == "déjà vu: 'Europe/Zürich'"
