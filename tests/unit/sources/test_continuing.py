"""Where an imported schedule goes on from: the fire time its source would use next,
from its last run."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from beat.models import ScheduleDefinition
from beat.schedule.define import define
from beat.schedule.timing import Every
from beat.sources.continuing import continued

NOW = datetime(2027, 3, 27, 12, 0, 7, tzinfo=UTC)


def interval(**fields: object) -> ScheduleDefinition:
    return define("job", "tasks.demo.add", every=600, now=NOW, **fields)  # type: ignore[arg-type]


def test_a_crontab_fires_at_its_first_time_after_the_last_run() -> None:
    nightly = define("job", "tasks.demo.add", cron="30 2 * * *", tz="Europe/Berlin", now=NOW)
    last_run = datetime(2027, 3, 27, 1, 30, 0, 400_000, tzinfo=UTC)  # 02:30 CET, late by 0.4 s
    # The next night is the change to summer time: 02:30 is skipped, 03:00 CEST fires.
    assert continued(nightly, last_run=last_run, now=NOW)[1] == datetime(
        2027, 3, 28, 1, 0, tzinfo=UTC
    )


def test_an_interval_fires_one_period_after_the_last_run_and_counts_from_there() -> None:
    last_run = NOW - timedelta(seconds=30)
    definition, next_fire_at = continued(interval(), last_run=last_run, now=NOW)
    assert next_fire_at == last_run + timedelta(minutes=10)
    assert definition.trigger == Every(seconds=600, anchor=next_fire_at)  # type: ignore[arg-type]


def test_a_fire_time_missed_while_no_beat_ran_is_due_now_and_counts_on_from_now() -> None:
    definition, next_fire_at = continued(interval(), last_run=NOW - timedelta(hours=2), now=NOW)
    assert next_fire_at == NOW
    assert definition.trigger == Every(seconds=600, anchor=NOW)


def test_never_run_is_due_now() -> None:
    assert continued(interval(), last_run=None, now=NOW)[1] == NOW


def test_nothing_fires_before_the_start_and_what_is_overdue_by_then_fires_at_it() -> None:
    start = NOW + timedelta(hours=5)
    _, next_fire_at = continued(
        interval(), last_run=NOW - timedelta(days=1), now=NOW, not_before=start
    )
    assert next_fire_at == start


def test_a_next_fire_time_past_the_end_of_the_window_is_none() -> None:
    ends = interval(end_at=NOW + timedelta(minutes=5))
    assert continued(ends, last_run=NOW - timedelta(minutes=1), now=NOW)[1] is None


def test_a_one_off_fires_at_its_time() -> None:
    at = NOW + timedelta(days=3)
    one_off = define("job", "tasks.demo.add", at=at, now=NOW)
    assert continued(one_off, last_run=None, now=NOW)[1] == at
