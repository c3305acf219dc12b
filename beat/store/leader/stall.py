"""A stall of the whole cluster: enabled schedules whose fire time passed more than
``stall_after`` ago unclaimed (six lease TTLs: a minute by default), by the database's
clock. Any beat process looks (a
standby too, and a process just started, before it leads), so that an outage of every
leader is told even though no leader is there to tell it: the first look that finds
some opens the cluster's one stall incident (with its notifications); the first that
finds none resolves it.

Not fenced by an epoch: these are findings any process may make, each write
conditional (one open stall incident, by its unique index), so several processes
looking at once write it once."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import Connection, func, select, text, update
from sqlalchemy.dialects.postgresql import insert

from beat.models import IncidentKind, NotificationEvent
from beat.store.leader.base import FencedStore
from beat.store.leader.notifications import notify_incident
from beat.store.tables import incidents, schedules

#: A fire time unclaimed for this many lease TTLs past its time is a stall: a leader
#: claims within moments, and a takeover takes about one TTL.
STALL_TTLS = 6
#: The stall threshold at the default lease TTL (10 s).
STALL_AFTER = timedelta(seconds=60)


def stall_after(lock_ttl: float) -> timedelta:
    """How long a fire time may wait unclaimed before the cluster counts as stalled."""
    return timedelta(seconds=STALL_TTLS * lock_ttl)


#: The name a stall incident goes by in the schedule column.
CLUSTER = "(cluster)"


@dataclass(frozen=True, kw_only=True, slots=True)
class StallReport:
    """What one look found and did."""

    overdue: int
    opened: bool = False
    resolved: bool = False
    detail: str | None = None


class StallStatements(FencedStore):
    """The stall incident of the whole cluster."""

    def watch_stall(self, *, stall_after: timedelta = STALL_AFTER) -> StallReport:
        """Open the stall incident when enabled schedules wait unclaimed more than
        ``stall_after`` past their fire time; resolve it when none does."""
        before = func.now() - func.make_interval(0, 0, 0, 0, 0, 0, stall_after.total_seconds())
        with self._transaction() as conn:
            overdue = conn.execute(
                select(func.count(), func.min(schedules.c.next_fire_at), func.now())
                .where(schedules.c.enabled, schedules.c.next_fire_at.is_not(None))
                .where(schedules.c.next_fire_at < before)
                .where(func.isfinite(schedules.c.next_fire_at))
            ).one()
            count, oldest, now = overdue
            if count:
                detail = _stall_detail(count, now - oldest)
                opened = conn.execute(
                    insert(incidents)
                    .values(
                        schedule_id=None,
                        schedule_name=CLUSTER,
                        kind=IncidentKind.STALL.value,
                        epoch=0,
                        failures=count,
                        last_error=detail,
                    )
                    .on_conflict_do_nothing(
                        index_elements=["kind"],
                        index_where=text("kind = 'stall' AND resolved_at IS NULL"),
                    )
                    .returning(incidents.c.id)
                ).scalar_one_or_none()
                if opened is not None:
                    self._notify(conn, NotificationEvent.OPENED, opened, now, detail=detail)
                return StallReport(overdue=count, opened=opened is not None, detail=detail)
            resolution = f"no fire time waits unclaimed past {stall_after.total_seconds():g}s"
            resolved = conn.execute(
                update(incidents)
                .where(
                    incidents.c.kind == IncidentKind.STALL.value,
                    incidents.c.resolved_at.is_(None),
                )
                .values(resolved_at=func.now(), resolution=resolution)
                .returning(incidents.c.id)
            ).scalar_one_or_none()
            if resolved is not None:
                self._notify(conn, NotificationEvent.RESOLVED, resolved, now, resolution=resolution)
            return StallReport(overdue=0, resolved=resolved is not None)

    def _notify(
        self,
        conn: Connection,
        event: NotificationEvent,
        incident_id: int,
        now: datetime,
        *,
        detail: str | None = None,
        resolution: str | None = None,
    ) -> None:
        notify_incident(
            conn,
            event,
            cluster=self.leader_name,
            incident_id=incident_id,
            schedule=CLUSTER,
            schedule_id=None,
            kind=IncidentKind.STALL,
            at=now,
            resolution=resolution,
            detail=detail,
        )


def _stall_detail(count: int, oldest: timedelta) -> str:
    minutes, seconds = divmod(int(oldest.total_seconds()), 60)
    waiting = "1 schedule waits" if count == 1 else f"{count} schedules wait"
    return f"{waiting} unclaimed, the oldest due {minutes}m{seconds:02d}s ago"
