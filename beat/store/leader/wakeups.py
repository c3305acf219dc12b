"""When the leader wakes: the next lease to expire, the next fire time or run held
back, and how many schedules fall due in each of the coming seconds."""

from __future__ import annotations

from typing import Any

from sqlalchemy import func, or_, select

from beat.claim.window import DueSecond
from beat.models import OverlapPolicy, RunState
from beat.store.leader.base import FencedStore, _seconds
from beat.store.leader.outbox import _deferred
from beat.store.tables import runs, schedules


class WakeupStatements(FencedStore):
    """The times the leader waits for."""

    def seconds_until_lease_expiry(self) -> float | None:
        """Seconds until the earliest lease of a running run expires (negative if it
        has), or None: the leader wakes then to reclaim the run of a dead worker."""
        query = select(func.extract("epoch", func.min(runs.c.lease_expires_at) - func.now())).where(
            runs.c.state == RunState.RUNNING.value
        )
        with self._transaction() as conn:
            seconds = conn.execute(query).scalar_one_or_none()
        return None if seconds is None else float(seconds)

    def seconds_until_next_fire(self, epoch: int | None = None) -> float | None:
        """Seconds until the earliest enabled fire time or run waiting for its
        ``not_before`` (negative if overdue), or None. Runs that leader ``epoch``
        claimed ahead (``not_before = fire_at``) are left out: it keeps them in memory."""
        next_fire = (
            select(func.min(schedules.c.next_fire_at))
            .where(schedules.c.enabled, schedules.c.next_fire_at.is_not(None))
            .scalar_subquery()
        )
        next_jittered = (
            select(func.min(runs.c.not_before))
            .where(
                runs.c.state == RunState.PENDING.value,
                runs.c.not_before.is_not(None),
                or_(_deferred(), runs.c.epoch.is_distinct_from(epoch)),
            )
            .scalar_subquery()
        )
        query = select(_seconds_until(func.least(next_fire, next_jittered)))
        with self._transaction() as conn:
            seconds = conn.execute(query).scalar_one_or_none()
        return None if seconds is None else float(seconds)

    def due_profile(self, horizon: float) -> list[DueSecond]:
        """How many schedules that may be claimed ahead (overlap policy ``allow``) are
        due within ``horizon`` seconds, by fire second (``beat.claim.window``), each at
        its earliest fire time; the overdue ones count in the first. One range of the
        due index."""
        until = _seconds_until(schedules.c.next_fire_at)
        second = func.greatest(0, func.floor(until)).label("second")
        query = (
            select(func.greatest(0, func.min(until)), func.count())
            .where(
                schedules.c.enabled,
                schedules.c.next_fire_at.is_not(None),
                schedules.c.next_fire_at <= func.now() + _seconds("horizon"),
                schedules.c.overlap_policy == OverlapPolicy.ALLOW.value,
            )
            .group_by(second)
            .order_by(second)
        )
        with self._transaction() as conn:
            rows = conn.execute(query, {"horizon": horizon}).all()
        return [DueSecond(seconds=float(row[0]), count=row[1]) for row in rows]


def _seconds_until(moment: Any) -> Any:
    """SQL: seconds from now until ``moment`` (negative if past). A row written with
    psql may hold ``-infinity`` or ``infinity``, which PostgreSQL cannot subtract from a
    time: told as infinite seconds (such a row is due, and its claim quarantines it)."""
    return func.extract("epoch", moment) - func.extract("epoch", func.now())
