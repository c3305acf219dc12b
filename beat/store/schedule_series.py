"""Each schedule's health as a few numbers for Prometheus: how many of its newest
finished runs failed in a row, and the fire time of its newest run that succeeded (among its newest
``SUCCESS_LOOKBACK``).

Read by the leader for its per-schedule series (``beat.leader.schedule_series``),
only while the cluster holds few enough schedules for a label each
(``habeat_metrics_schedule_limit``): one statement, each schedule's newest runs read
from the history index ``(schedule_name, fire_at DESC)``, which carries the state, so
no table page is read for them.

A run counts by its fire time (runs sent with ``delay()`` have none, and are not a
schedule's). A run that ended ``failed``, ``lost`` or ``expired`` is a failure; one
that ``succeeded`` ends a streak; ``skipped`` and ``cancelled`` runs (a policy's
decision) and runs not finished are passed over.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import func, select, text

from beat.models import RunState
from beat.store.db import StoreConnection
from beat.store.tables import schedules

#: The states that count as a failure of the schedule.
FAILURES = (RunState.FAILED, RunState.LOST, RunState.EXPIRED)
#: The newest finished runs read per schedule: a streak is counted up to this.
STREAK_LIMIT = 100
#: The newest runs a last success is looked for among: a schedule that has failed for
#: longer has none, and costs a bounded read (its whole history would be read else).
SUCCESS_LOOKBACK = 10_000


@dataclass(frozen=True, kw_only=True, slots=True)
class ScheduleSeries:
    """One schedule's numbers."""

    name: str
    #: Its newest finished runs that failed, in a row (up to ``STREAK_LIMIT``).
    consecutive_failures: int
    #: The fire time of its newest run that succeeded; None if none of its newest
    #: ``SUCCESS_LOOKBACK`` runs did (or none is kept).
    last_success: datetime | None


class ScheduleSeriesReads(StoreConnection):
    """The per-schedule series, read in one snapshot."""

    def schedule_series(self, *, limit: int) -> list[ScheduleSeries] | None:
        """Every schedule's numbers, by name; None when there are more than ``limit``
        schedules (nothing else is read then)."""
        with self._transaction() as conn:
            count = conn.execute(select(func.count()).select_from(schedules)).scalar_one()
            if count > limit:
                return None
            rows = conn.execute(
                text(_SERIES_SQL),
                {"streak_limit": STREAK_LIMIT, "success_lookback": SUCCESS_LOOKBACK},
            ).all()
        return [
            ScheduleSeries(
                name=row.name,
                consecutive_failures=int(row.failures),
                last_success=row.last_success,
            )
            for row in rows
        ]


_COUNTED = ", ".join(repr(state.value) for state in (*FAILURES, RunState.SUCCEEDED))
#: Per schedule, laterally: its newest finished runs that count, their positions
#: numbered newest first (the streak is the count before the first success, or all of
#: them), and its newest success. Both read the history index alone.
_SERIES_SQL = f"""
SELECT s.name, streak.failures, success.fire_at AS last_success
FROM beat_schedules AS s
CROSS JOIN LATERAL (
    SELECT coalesce(
               min(newest.position) FILTER (WHERE newest.state = 'succeeded') - 1,
               count(*)
           ) AS failures
    FROM (
        SELECT r.state, row_number() OVER (ORDER BY r.fire_at DESC) AS position
        FROM beat_runs AS r
        WHERE r.schedule_name = s.name
          AND r.fire_at IS NOT NULL
          AND r.state IN ({_COUNTED})
        ORDER BY r.fire_at DESC
        LIMIT :streak_limit
    ) AS newest
) AS streak
LEFT JOIN LATERAL (
    SELECT newest.fire_at
    FROM (
        SELECT r.fire_at, r.state
        FROM beat_runs AS r
        WHERE r.schedule_name = s.name AND r.fire_at IS NOT NULL
        ORDER BY r.fire_at DESC
        LIMIT :success_lookback
    ) AS newest
    WHERE newest.state = 'succeeded'
    ORDER BY newest.fire_at DESC
    LIMIT 1
) AS success ON true
ORDER BY s.name
"""
