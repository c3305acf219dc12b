"""A page of the schedule list (``ScheduleStore.page_schedules``), against real
PostgreSQL: for every filter and offset, the rows and the count a plain query gives
(the page's names are found first, a filtered count in the same scan, the columns
read for the page's rows only)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy import func, insert, or_, select

from beat.ops.schedules import ScheduleFilter
from beat.store.all_roles import Store
from beat.store.schedules import contains
from beat.store.tables import schedules

pytestmark = pytest.mark.integration

COUNT = 230
PAGE = 50


def add_schedules(store: Store) -> None:
    """``COUNT`` interval schedules, every seventh paused, in two tasks."""
    now = store.now()
    rows = [
        {
            "name": f"page-{number:04d}",
            "task": f"tasks.t{number % 2}",
            "trigger_kind": "every",
            "every_seconds": 60,
            "anchor_at": now,
            "next_fire_at": now + timedelta(hours=1),
            "enabled": number % 7 != 0,
        }
        for number in range(1, COUNT + 1)
    ]
    with store.engine.begin() as conn:
        conn.execute(insert(schedules), rows)


def by_oracle(store: Store, where: ScheduleFilter, offset: int) -> tuple[list[str], int]:
    """The page's names and the count, from one plain query of every matching row."""
    conditions = []
    if where.search is not None:
        conditions.append(
            or_(contains(schedules.c.name, where.search), contains(schedules.c.task, where.search))
        )
    if where.paused is not None:
        conditions.append(schedules.c.enabled.is_not(where.paused))
    with store.engine.connect() as conn:
        names = list(
            conn.execute(
                select(schedules.c.name).where(*conditions).order_by(schedules.c.name)
            ).scalars()
        )
        assert conn.execute(select(func.count()).select_from(schedules)).scalar_one() == COUNT
    return names[offset : offset + PAGE], len(names)


@pytest.mark.parametrize(
    "where",
    [
        ScheduleFilter(),
        ScheduleFilter(search="-01"),
        ScheduleFilter(search="T1"),
        ScheduleFilter(search="no such"),
        ScheduleFilter(paused=True),
        ScheduleFilter(paused=False, search="-00"),
    ],
    ids=repr,
)
@pytest.mark.parametrize("offset", [0, 40, 100, 180, 229, 230, 400])
def test_a_page_holds_what_a_plain_query_gives(
    store: Store, where: ScheduleFilter, offset: int
) -> None:
    add_schedules(store)

    found, total = store.page_schedules(where, offset=offset, limit=PAGE)

    names, count = by_oracle(store, where, offset)
    assert ([schedule.name for schedule in found], total) == (names, count)
    # Whole schedules, not names only.
    assert all(schedule.definition.task.startswith("tasks.t") for schedule in found)
