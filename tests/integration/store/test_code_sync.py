"""Syncing code schedules across a deploy: fire times missed while every beat was
down are handled by the misfire policy, whatever changed in the code; a crontab()
keeps Celery's reading of its day fields through the database."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from celery.schedules import crontab
from sqlalchemy import text

from beat.models import RunState
from beat.ops.rendering import spec_text
from beat.ops.schedules import Schedules
from beat.schedule.timing import Cron, next_fire_after
from beat.scheduler import HAScheduler
from beat.store.all_roles import Store
from tests.integration.helpers import make_due, run_rows

pytestmark = pytest.mark.integration

SchedulerFactory = Callable[..., HAScheduler]

#: Fire times older than this are misfires in these tests (the default is 60 s).
GRACE = 10.0


def code(policy: str, *, every: float = 10.0, x: int = 1) -> dict[str, Any]:
    entry = {"task": "tasks.demo.add", "schedule": every, "kwargs": {"x": x}}
    return {"beat_schedule": {"job": entry | {"misfire_policy": policy}}}


def deploy_after_downtime(
    make_scheduler: SchedulerFactory, store: Store, before: dict[str, Any], after: dict[str, Any]
) -> Any:
    """Beat runs ``before``, every beat stops for 35 s, beat starts again with ``after``;
    returns the schedule's next fire time when beat stopped."""
    old = make_scheduler(before, misfire_grace=GRACE)
    old.tick()
    old.close()
    make_due(store, seconds_ago=35)  # missed since: -35 s, -25 s, -15 s; -5 s within grace
    missed_from = Schedules(store).get("job").next_fire_at
    make_scheduler(after, misfire_grace=GRACE).tick()
    return missed_from


@pytest.mark.parametrize(
    ("policy", "queued", "skipped"),
    [("fire_all", [0, 1, 2, 3], []), ("fire_once", [2, 3], [0, 1]), ("skip", [3], [0, 1, 2])],
)
def test_a_kwargs_change_keeps_the_fire_times_missed_during_the_deploy(
    make_scheduler: SchedulerFactory,
    store: Store,
    policy: str,
    queued: list[int],
    skipped: list[int],
) -> None:
    """A kwargs change keeps the fire times missed during the deploy. Finding 6 of issue 15."""
    missed_from = deploy_after_downtime(make_scheduler, store, code(policy, x=1), code(policy, x=2))

    rows = run_rows(store)
    by_state = {
        state: [
            (row.fire_at - missed_from) / timedelta(seconds=10)
            for row in rows
            if row.state == state
        ]
        for state in (RunState.QUEUED.value, RunState.SKIPPED.value)
    }
    assert by_state == {RunState.QUEUED.value: queued, RunState.SKIPPED.value: skipped}
    assert all(row.kwargs == {"x": 2} for row in rows), "the runs carry the new definition"
    assert all("misfire" in row.reason for row in rows if row.state == RunState.SKIPPED.value)


def test_a_timing_change_still_handles_the_fire_time_missed_under_the_old_one(
    make_scheduler: SchedulerFactory, store: Store
) -> None:
    """A timing change still handles the fire time missed before it. Finding 6 of issue 15."""
    missed_from = deploy_after_downtime(
        make_scheduler, store, code("fire_all", every=10), code("fire_all", every=20)
    )

    rows = run_rows(store)
    # From the first missed fire time on, the new timing's: -35 s and -15 s, both run.
    assert [row.fire_at - missed_from for row in rows] == [timedelta(0), timedelta(seconds=20)]
    assert {row.state for row in rows} == {RunState.QUEUED.value}
    job = Schedules(store).get("job")
    assert job.next_fire_at == missed_from + timedelta(seconds=40), "the interval keeps its phase"


# A crontab() whose day fields are both restricted needs a day matching both.

BERLIN = ZoneInfo("Europe/Berlin")
FIRST_MONDAY = Cron(expression="0 9 1-7 * 1", both_days=True)


def first_monday_code() -> dict[str, Any]:
    schedule = crontab(minute=0, hour=9, day_of_month="1-7", day_of_week="mon")
    return {
        "timezone": "Europe/Berlin",
        "beat_schedule": {"job": {"task": "tasks.demo.add", "schedule": schedule}},
    }


def test_a_first_monday_crontab_is_stored_shown_and_claimed_as_both_days(
    make_scheduler: SchedulerFactory, store: Store
) -> None:
    first = make_scheduler(first_monday_code())
    first.tick()
    first.close()
    job = Schedules(store).get("job")
    assert job.definition.trigger == FIRST_MONDAY
    assert spec_text(job) == "cron 0 9 1-7 * 1 (day of month and day of week both match)"
    assert job.next_fire_at == next_fire_after(FIRST_MONDAY, BERLIN, job.created_at)

    make_due(store, seconds_ago=5)  # the claim reads the trigger from its own query
    make_scheduler(first_monday_code()).tick()
    [run] = run_rows(store)
    assert Schedules(store).get("job").next_fire_at == next_fire_after(
        FIRST_MONDAY, BERLIN, run.fire_at
    )


def test_a_crontab_synced_by_the_either_reading_is_synced_again(
    make_scheduler: SchedulerFactory, store: Store
) -> None:
    make_scheduler(first_monday_code()).tick()
    either = Cron(expression="0 9 1-7 * mon")
    with store.engine.begin() as conn:  # as the code before both_days stored it
        conn.execute(
            text(
                "UPDATE beat_schedules SET cron = :cron, cron_both_days = false,"
                " code_hash = 'before', next_fire_at = :next"
            ),
            {"cron": either.expression, "next": next_fire_after(either, BERLIN, store.now())},
        )

    make_scheduler(first_monday_code()).tick()
    job = Schedules(store).get("job")
    assert job.definition.trigger == FIRST_MONDAY
    assert job.next_fire_at == next_fire_after(FIRST_MONDAY, BERLIN, store.now())


def test_a_change_of_anything_else_keeps_both_days(
    make_scheduler: SchedulerFactory, store: Store
) -> None:
    make_scheduler(first_monday_code()).tick()
    Schedules(store).update("job", options={"queue": "reports"})
    assert Schedules(store).get("job").definition.trigger == FIRST_MONDAY


def test_a_deploy_right_after_a_retiming_one_keeps_the_fire_times_missed_during_both(
    make_scheduler: SchedulerFactory, store: Store
) -> None:
    """Two deploys in a row: the first changes the timing and every beat stops again
    right after its sync, before any claim; the second changes only the kwargs. Every
    fire time missed during both (the old timing's unclaimed one, then the new timing's
    since) is still claimed."""
    old = make_scheduler(code("fire_all", every=10, x=1))
    old.tick()
    old.close()
    make_due(store, seconds_ago=35)
    missed_from = Schedules(store).get("job").next_fire_at
    make_scheduler(code("fire_all", every=20, x=2)).close()  # synced, stopped at once
    make_scheduler(code("fire_all", every=20, x=3), misfire_grace=GRACE * 10).tick()

    rows = run_rows(store)
    assert [row.fire_at - missed_from for row in rows] == [timedelta(0), timedelta(seconds=20)]
    assert {row.state for row in rows} == {RunState.QUEUED.value}


def test_a_second_new_timing_follows_the_fire_time_the_first_one_kept(
    make_scheduler: SchedulerFactory, store: Store
) -> None:
    """Chaos seed 20261205 (deployed-0, 07:11): three deploys in a row, every beat
    stopped again right after each sync, before any claim: a new timing, then only the
    kwargs, then another new timing. The old timing's unclaimed fire time, kept by the
    first, is still the next fire time at the third: it stays, and the third timing's
    fire times follow it, as after a single retiming; the second timing's fire times
    since never come due (no claim ran under it)."""
    old = make_scheduler(code("fire_all", every=10, x=1))
    old.tick()
    old.close()
    make_due(store, seconds_ago=45)  # the interval's anchor too: fire times on -45 s + k·N
    missed_from = Schedules(store).get("job").next_fire_at
    assert missed_from is not None
    make_scheduler(code("fire_all", every=20, x=2)).close()  # -25 s, -5 s: never claimed
    make_scheduler(code("fire_all", every=20, x=3)).close()
    assert Schedules(store).get("job").next_fire_at == missed_from
    make_scheduler(code("fire_all", every=30, x=4), misfire_grace=GRACE * 10).tick()

    rows = run_rows(store)
    assert [row.fire_at - missed_from for row in rows] == [timedelta(0), timedelta(seconds=30)]
    assert {row.state for row in rows} == {RunState.QUEUED.value}
    assert all(row.kwargs == {"x": 4} for row in rows), "claimed under the definition in force"
    job = Schedules(store).get("job")
    assert job.next_fire_at == missed_from + timedelta(seconds=60), "the interval keeps its phase"
