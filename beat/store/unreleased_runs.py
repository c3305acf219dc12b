"""What a change of a schedule does to its runs claimed but not released yet
(claimed ahead of their fire time, or held back by jitter): cancelled when the
schedule is paused, deleted or removed from code; withdrawn when it is redefined,
so that their fire times run under the new definition."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from sqlalchemy import (
    ColumnElement,
    Connection,
    Row,
    delete,
    func,
    update,
)

from beat.models import (
    RunState,
    ScheduleDefinition,
)
from beat.store.tables import runs


def _unreleased(schedule_id: int) -> list[ColumnElement[bool]]:
    """The runs of a schedule claimed but not released yet: ``pending`` with a
    ``not_before`` to come (claimed ahead of their fire time, or held back by jitter),
    never published and never retried. A run pending again after it was published (its
    worker killed and the run reclaimed, its message lost and sent again) came due
    before the change and is due again later: it goes on, it is not withdrawn. So does
    a retry given back by the reaper for its due time (its worker stopped while it held
    the retry): the reaper clears the times of the deliveries before it, published_at
    included, but its ``retries`` count says it ran."""
    return [
        runs.c.schedule_id == schedule_id,
        runs.c.state == RunState.PENDING.value,
        runs.c.not_before > func.now(),
        runs.c.published_at.is_(None),
        runs.c.retries == 0,
    ]


def cancel_unreleased(conn: Connection, schedule_id: int, why: str) -> list[uuid.UUID]:
    """Cancel the runs of a schedule that are claimed but not released yet: claimed
    ahead of their fire time (minutes ahead of a large burst, ``beat.claim.window``)
    or held back by their jitter. The leader may still send one it holds in memory;
    the worker's guard refuses a cancelled run. A run already released (its time has
    come) goes on: what was due before the change runs. The runs cancelled."""
    return list(
        conn.scalars(
            update(runs)
            .where(*_unreleased(schedule_id))
            .values(
                state=RunState.CANCELLED.value,
                finished_at=func.now(),
                reason=f"{why} before its fire time",
            )
            .returning(runs.c.id)
        )
    )


def withdraw_unreleased(
    conn: Connection, row: Row[Any], next_fire_at: datetime | None, *, retimed: bool
) -> tuple[datetime | None, int]:
    """A schedule's definition changed: delete its runs claimed but not released yet
    (claimed ahead, or held back by jitter), so that their fire times run under the
    new definition. The schedule's next fire time and count of runs to set: with the
    same timing, its next fire time goes back to the earliest withdrawn one (claimed
    again, with the new arguments); with a new timing, the withdrawn fire times of the
    old one are dropped. The leader may still send a message it built for one: the
    worker's guard refuses a run that has no row."""
    withdrawn = list(
        conn.scalars(delete(runs).where(*_unreleased(row.id)).returning(runs.c.fire_at))
    )
    fire_times = [fire_at for fire_at in withdrawn if fire_at is not None]
    if fire_times and not retimed:
        earliest = min(fire_times)
        next_fire_at = earliest if next_fire_at is None else min(next_fire_at, earliest)
    return next_fire_at, max(0, row.runs_count - len(fire_times))


def timing(definition: ScheduleDefinition) -> tuple[Any, ...]:
    """What decides a schedule's fire times (its window, start_at and end_at, only
    bounds them: the claim applies it to a fire time claimed again)."""
    return (definition.trigger, definition.timezone)
