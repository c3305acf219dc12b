"""Each schedule's series for Prometheus against real PostgreSQL, checked against an
oracle over every run stored: its newest finished runs that failed in a row (failed,
lost or expired; skipped, cancelled and unfinished runs passed over), and the fire time
of its newest success."""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import delete, insert, select

from beat.models import RunState
from beat.ops.schedules import Schedules
from beat.store.all_roles import Store
from beat.store.schedule_series import ScheduleSeries, ScheduleSeriesReads
from beat.store.tables import runs

pytestmark = pytest.mark.integration

NAMES = [f"series-{index}" for index in range(4)]
FAILURES = {RunState.FAILED, RunState.LOST, RunState.EXPIRED}


@pytest.fixture
def reads(store: Store) -> ScheduleSeriesReads:
    schedules = Schedules(store)
    for name in NAMES:
        schedules.create(name, "tasks.demo.add", every=60, allow_unregistered=True)
    return ScheduleSeriesReads(store.engine)


#: A run: its schedule, how many minutes before now it fired (None: sent with delay(),
#: no fire time), its state.
runs_of = st.lists(
    st.tuples(
        st.sampled_from([*NAMES, "removed-long-ago"]),
        st.one_of(st.none(), st.integers(0, 500)),
        st.sampled_from(list(RunState)),
    ),
    max_size=40,
    # One run per schedule and fire time, as the claim's unique key keeps them.
    unique_by=lambda run: (run[0], run[1]),
)


def series_by_oracle(rows: list[Any], names: list[str]) -> list[ScheduleSeries]:
    found = []
    for name in sorted(names):
        mine = sorted(
            (row for row in rows if row.schedule_name == name and row.fire_at is not None),
            key=lambda row: row.fire_at,
            reverse=True,
        )
        counted = [
            RunState(row.state)
            for row in mine
            if RunState(row.state) in FAILURES | {RunState.SUCCEEDED}
        ]
        streak = 0
        for state in counted:
            if state == RunState.SUCCEEDED:
                break
            streak += 1
        successes = [row.fire_at for row in mine if row.state == RunState.SUCCEEDED.value]
        found.append(
            ScheduleSeries(
                name=name,
                consecutive_failures=streak,
                last_success=successes[0] if successes else None,
            )
        )
    return found


def stored(store: Store) -> list[Any]:
    with store.engine.connect() as conn:
        return list(conn.execute(select(runs)))


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(history=runs_of)
def test_each_schedule_s_failures_in_a_row_and_newest_success_match_an_oracle(
    reads: ScheduleSeriesReads, store: Store, history: list[tuple[str, int | None, RunState]]
) -> None:
    with store.engine.begin() as conn:
        conn.execute(delete(runs))
        now: datetime = store.now()
        rows: list[dict[str, Any]] = [
            {
                "id": uuid.uuid4(),
                "schedule_name": name,
                "task": "tasks.demo.add",
                "state": state.value,
                "fire_at": None if minutes is None else now - timedelta(minutes=minutes),
                "claimed_at": now - timedelta(minutes=minutes or 0),
            }
            for name, minutes, state in history
        ]
        if rows:
            conn.execute(insert(runs), rows)

    found = reads.schedule_series(limit=len(NAMES))

    assert found == series_by_oracle(stored(store), NAMES)


def test_a_streak_is_counted_up_to_its_limit(
    reads: ScheduleSeriesReads, store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("beat.store.schedule_series.STREAK_LIMIT", 3)
    now = store.now()
    with store.engine.begin() as conn:
        conn.execute(delete(runs))
        conn.execute(
            insert(runs),
            [
                {
                    "id": uuid.uuid4(),
                    "schedule_name": NAMES[0],
                    "task": "tasks.demo.add",
                    "state": RunState.FAILED.value,
                    "fire_at": now - timedelta(minutes=minutes),
                    "claimed_at": now - timedelta(minutes=minutes),
                }
                for minutes in range(5)
            ],
        )
    found = reads.schedule_series(limit=len(NAMES))
    assert found is not None
    assert found[0].consecutive_failures == 3


def test_more_schedules_than_the_limit_read_nothing(reads: ScheduleSeriesReads) -> None:
    assert reads.schedule_series(limit=len(NAMES) - 1) is None
    assert reads.schedule_series(limit=0) is None
