"""The "failing" filter of the schedule list against real PostgreSQL, checked against
an oracle over every run stored (a schedule is failing when its newest run by fire time
failed or was lost): with runs summarised and recorded as outcomes, runs finished
since, runs not finished, and runs whose state changed after they were recorded."""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import delete, insert, select, update

from beat.models import FINISHED_STATES, RunState
from beat.ops.schedules import ScheduleFilter, Schedules
from beat.store.all_roles import Store
from beat.store.leader import LeaderStore
from beat.store.stats import RunStatsStore
from beat.store.tables import run_minutes, run_summary, runs, schedule_outcomes

pytestmark = pytest.mark.integration

NAMES = [f"outcome-{index}" for index in range(5)]
FAILED = {RunState.FAILED, RunState.LOST}


@pytest.fixture
def api(store: Store) -> Schedules:
    schedules = Schedules(store)
    for name in NAMES:
        schedules.create(name, "tasks.demo.add", every=60, allow_unregistered=True)
    return schedules


#: A run: its schedule, how many minutes before now it fired, its state.
runs_of = st.lists(
    st.tuples(st.sampled_from(NAMES), st.integers(0, 119), st.sampled_from(list(RunState))),
    max_size=25,
    unique_by=lambda run: (run[0], run[1]),
)
#: A change made after the summary: (index of a run, its new state).
changes_of = st.lists(st.tuples(st.integers(0, 24), st.sampled_from(list(RunState))), max_size=5)


def run_row(name: str, fire_at: datetime, state: RunState, finished_at: datetime) -> dict[str, Any]:
    return {
        "id": uuid.uuid4(),
        "schedule_name": name,
        "task": "tasks.demo.add",
        "state": state.value,
        "fire_at": fire_at,
        "claimed_at": fire_at,
        "finished_at": finished_at if state in FINISHED_STATES else None,
    }


def insert_runs(store: Store, *rows: dict[str, Any]) -> None:
    with store.engine.begin() as conn:
        conn.execute(insert(runs), list(rows))


def failing_by_oracle(store: Store) -> list[str]:
    newest: dict[str, Any] = {}
    with store.engine.connect() as conn:
        for row in conn.execute(select(runs)):
            if row.schedule_name not in newest or row.fire_at > newest[row.schedule_name].fire_at:
                newest[row.schedule_name] = row
    return sorted(name for name, row in newest.items() if RunState(row.state) in FAILED)


def start_afresh(store: Store) -> None:
    with store.engine.begin() as conn:
        for table in (runs, schedule_outcomes, run_minutes, run_summary):
            conn.execute(delete(table))


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(old=runs_of, recent=runs_of, changes=changes_of, summarise=st.booleans())
def test_failing_schedules_are_those_whose_newest_run_failed_or_was_lost(
    api: Schedules,
    store: Store,
    old: list[tuple[str, int, RunState]],
    recent: list[tuple[str, int, RunState]],
    changes: list[tuple[int, RunState]],
    summarise: bool,
) -> None:
    start_afresh(store)
    now = store.now()
    # Fired 10 minutes ago and earlier, finished a second later: settled, summarised.
    old_rows = [
        run_row(name, fire_at, state, fire_at + timedelta(seconds=1))
        for name, minutes, state in old
        for fire_at in [now - timedelta(minutes=10 + minutes)]
    ]
    with store.engine.begin() as conn:
        if old_rows:
            conn.execute(insert(runs), old_rows)
    if summarise:
        RunStatsStore(store.engine).summarise()
    # Fired in the last few minutes, some newer than every old run of their schedule:
    # finished just now (read live), or not finished.
    recent_rows = [
        run_row(name, now - timedelta(seconds=minutes), state, now)
        for name, minutes, state in recent
    ]
    with store.engine.begin() as conn:
        if recent_rows:
            conn.execute(insert(runs), recent_rows)
        # An old run whose state changed since it was recorded (a lost plain run that
        # reported its outcome, a failed one retried): its finished time changes too.
        for index, state in changes:
            if index < len(old_rows):
                conn.execute(
                    update(runs)
                    .where(runs.c.id == old_rows[index]["id"])
                    .values(
                        state=state.value, finished_at=now if state in FINISHED_STATES else None
                    )
                )

    page = api.page(ScheduleFilter(failing=True), limit=50)

    assert sorted(row.schedule.name for row in page.rows) == failing_by_oracle(store)
    assert page.total == len(page.rows)


def test_the_outcomes_are_recorded_as_the_summary_moves_and_a_stale_one_decides_nothing(
    api: Schedules, store: Store
) -> None:
    start_afresh(store)
    now = store.now()
    failed = run_row(
        "outcome-0", now - timedelta(minutes=30), RunState.FAILED, now - timedelta(minutes=29)
    )
    insert_runs(store, failed)
    RunStatsStore(store.engine).summarise()
    with store.engine.connect() as conn:
        recorded = conn.execute(select(schedule_outcomes)).all()
        summary = conn.execute(select(run_summary)).one()
    assert [(row.schedule_name, row.state) for row in recorded] == [("outcome-0", "failed")]
    assert summary.outcomes_until == summary.summarised_until
    assert [row.schedule.name for row in api.page(ScheduleFilter(failing=True)).rows] == [
        "outcome-0"
    ]

    # Retried after it was recorded: no longer finished, so no longer failing, although
    # its recorded outcome still says failed.
    with store.engine.begin() as conn:
        conn.execute(
            update(runs)
            .where(runs.c.id == failed["id"])
            .values(state=RunState.RETRYING.value, finished_at=None)
        )
    assert api.page(ScheduleFilter(failing=True)).rows == []


def test_outcomes_a_summariser_left_unrecorded_catch_up_a_batch_a_pass(
    api: Schedules, store: Store
) -> None:
    start_afresh(store)
    now = store.now()
    five, three = now - timedelta(hours=5), now - timedelta(hours=3)
    insert_runs(
        store,
        run_row("outcome-1", five, RunState.SUCCEEDED, five + timedelta(seconds=1)),
        run_row("outcome-0", three, RunState.FAILED, three + timedelta(seconds=1)),
    )
    summaries = RunStatsStore(store.engine)
    summaries.summarise()
    # A summariser of the release before the outcomes moved the summary on alone.
    with store.engine.begin() as conn:
        conn.execute(delete(schedule_outcomes))
        conn.execute(update(run_summary).values(outcomes_until=None))

    passes = []
    while True:
        assert [row.schedule.name for row in api.page(ScheduleFilter(failing=True)).rows] == [
            "outcome-0"
        ]
        with store.engine.connect() as conn:
            summary = conn.execute(select(run_summary)).one()
        if summary.outcomes_until == summary.summarised_until:
            break
        passes.append(summary.outcomes_until)
        summaries.summarise(batch=timedelta(hours=1))

    # From the oldest finished run's minute, an hour a pass.
    assert len(passes) >= 5
    with store.engine.connect() as conn:
        recorded = {row.schedule_name: row.state for row in conn.execute(select(schedule_outcomes))}
    assert recorded == {"outcome-1": "succeeded", "outcome-0": "failed"}


def test_a_failure_that_outlived_a_newer_run_retention_deleted_is_failing(
    api: Schedules, store: Store
) -> None:
    start_afresh(store)
    now = store.now()
    # The older fire time ran long and failed; the newer one was cancelled at once.
    outlived = run_row(
        "outcome-0", now - timedelta(hours=5), RunState.FAILED, now - timedelta(hours=3)
    )
    newer = run_row(
        "outcome-0",
        now - timedelta(hours=4, minutes=59),
        RunState.CANCELLED,
        now - timedelta(hours=4, minutes=58),
    )
    insert_runs(store, outlived, newer)
    RunStatsStore(store.engine).summarise()
    assert api.page(ScheduleFilter(failing=True)).rows == []

    report = LeaderStore(store.engine).prune(timedelta(hours=4))

    assert report.deleted == 1
    assert failing_by_oracle(store) == ["outcome-0"]
    assert [row.schedule.name for row in api.page(ScheduleFilter(failing=True)).rows] == [
        "outcome-0"
    ]
    with store.engine.connect() as conn:
        recorded = conn.execute(select(schedule_outcomes)).one()
    assert (recorded.fire_at, recorded.state) == (outlived["fire_at"], "failed")
