"""Validation of schedule definitions: every bad input is refused with a message naming it."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from beat.errors import InvalidSchedule
from beat.models import MisfirePolicy
from beat.ops.schedules import MAX_PAYLOAD_BYTES
from beat.schedule.define import define, first_fire_at
from beat.schedule.timing import Cron, Every, Once


def test_a_cron_schedule_is_defined_in_its_zone() -> None:
    definition = define(
        "report", "tasks.report", cron="30 2 * * *", tz="Europe/Berlin", args=(1, "a")
    )
    assert definition.trigger == Cron(expression="30 2 * * *")
    assert definition.timezone == "Europe/Berlin"
    assert definition.args == (1, "a")
    now = datetime(2026, 3, 29, 0, 0, tzinfo=UTC)  # Berlin springs forward at 02:00 local
    assert first_fire_at(definition, now) == datetime(2026, 3, 29, 1, 0, tzinfo=UTC)


def test_every_and_at() -> None:
    start = datetime(2026, 1, 1, tzinfo=UTC)
    definition = define("tick", "t", every=timedelta(minutes=5), start_at=start)
    assert definition.trigger == Every(seconds=300.0, anchor=start)
    assert first_fire_at(definition, start + timedelta(minutes=7)) == start + timedelta(minutes=10)
    at = datetime(2020, 1, 1, tzinfo=UTC)
    assert define("once", "t", at=at, allow_past=True).trigger == Once(at=at)


def test_relative_times_count_from_the_given_now() -> None:
    """Relative times count from the given now, not this host's. Finding 9 of issue 15."""
    now = datetime(2026, 1, 1, 12, tzinfo=UTC)  # the database's, not this host's
    assert define("soon", "t", in_seconds=90, now=now).trigger == Once(
        at=now + timedelta(seconds=90)
    )
    assert define("tick", "t", every=60, now=now).trigger == Every(seconds=60.0, anchor=now)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"cron": "61 * * * *"}, "invalid cron expression '61 * * * *'"),
        ({"cron": "* * *"}, "'* * *'"),
        ({"cron": "0 3 * * *", "tz": "Mars/Olympus"}, "unknown time zone 'Mars/Olympus'"),
        ({}, "give exactly one of cron, every or at"),
        ({"cron": "* * * * *", "every": 5}, "got cron, every"),
        ({"every": 0.5}, "0.5"),
        ({"at": datetime(2026, 1, 1)}, "has no time zone"),
        ({"every": 5, "args": "abc"}, "args must be a JSON array"),
        ({"every": 5, "kwargs": [1]}, "kwargs must be a JSON object"),
        ({"every": 5, "args": [object()]}, "plain JSON"),
        ({"every": 5, "args": [float("nan")]}, "plain JSON"),
        ({"every": 5, "args": ["x" * MAX_PAYLOAD_BYTES]}, "over the 65536-byte limit"),
        ({"every": 5, "options": {"countdown": 10}}, "countdown"),
        ({"every": 5, "misfire_policy": "sometimes"}, "unknown misfire policy 'sometimes'"),
        ({"every": 5, "max_attempts": 0}, "max_attempts"),
    ],
)
def test_bad_input_is_refused_with_a_message_naming_it(
    fields: dict[str, object], message: str
) -> None:
    with pytest.raises(InvalidSchedule) as caught:
        define("name", "tasks.t", **fields)  # type: ignore[arg-type]
    assert message in str(caught.value)
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize("name", ["", "x" * 201, "nul\x00", "tab\there", "new\nline", "\x1b[31m"])
def test_bad_names_are_refused(name: str) -> None:
    with pytest.raises(InvalidSchedule, match="schedule name"):
        define(name, "t", every=5)


@pytest.mark.parametrize(
    "name",
    ["add every 10", "1 sec queue probe", "semi;colon", "Ünïcode ok", "50% off?", "a/b#c&d"],
)
def test_every_printable_name_celery_accepts_is_kept_exactly(name: str) -> None:
    """issue 36, finding 1: Celery's docs name entries 'add every 10'; any printable
    text of bounded length is a name, kept as written."""
    assert define(name, "t", every=5).name == name


def test_json_payload_is_normalised() -> None:
    definition = define("n", "t", every=5, args=((1, 2), {"a": (3,)}), misfire_policy="fire_all")
    assert definition.args == ([1, 2], {"a": [3]})
    assert definition.misfire_policy is MisfirePolicy.FIRE_ALL
