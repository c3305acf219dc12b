"""The writes every monitor makes of its incidents, in the caller's fenced transaction:
open one (at most one open per schedule and kind), resolve one."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import Connection, func, text, update
from sqlalchemy.dialects.postgresql import insert as pg_insert

from beat.models import IncidentKind
from beat.store.tables import incidents


def open_incident(
    conn: Connection,
    *,
    schedule: tuple[int, str],
    kind: IncidentKind,
    epoch: int,
    count: int,
    first_at: datetime | None,
    finding: str | None,
) -> int | None:
    """Open the incident of ``kind`` of ``schedule`` (its ID and name); its ID, or None
    if one is open already."""
    schedule_id, name = schedule
    opened: int | None = conn.execute(
        pg_insert(incidents)
        .values(
            schedule_id=schedule_id,
            schedule_name=name,
            kind=kind.value,
            epoch=epoch,
            failures=count,
            first_failure_at=first_at,
            last_error=finding,
        )
        .on_conflict_do_nothing(
            index_elements=["schedule_id", "kind"], index_where=text("resolved_at IS NULL")
        )
        .returning(incidents.c.id)
    ).scalar_one_or_none()
    return opened


def resolve_incident(conn: Connection, incident_id: int, resolution: str) -> None:
    """Resolve incident ``incident_id`` (once: a resolved one stays as it was)."""
    conn.execute(
        update(incidents)
        .where(incidents.c.id == incident_id, incidents.c.resolved_at.is_(None))
        .values(resolved_at=func.now(), resolution=resolution)
    )
