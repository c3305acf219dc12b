"""The incidents as operators read them: the CLI, ``schedules health`` and the UI."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Row, select

from beat.models import Incident, IncidentKind
from beat.store.leader.base import FencedStore
from beat.store.tables import incidents


class IncidentReads(FencedStore):
    """Reads of ``beat_incidents``; nothing here writes."""

    def incidents(self, *, include_resolved: bool = False, limit: int = 100) -> list[Incident]:
        """Incidents newest first: the open ones, or all with ``include_resolved``."""
        query = select(incidents).order_by(incidents.c.opened_at.desc(), incidents.c.id.desc())
        if not include_resolved:
            query = query.where(incidents.c.resolved_at.is_(None))
        with self._transaction() as conn:
            return [incident_from_row(row) for row in conn.execute(query.limit(limit))]


def incident_from_row(row: Row[Any]) -> Incident:
    return Incident(
        id=row.id,
        schedule_name=row.schedule_name,
        kind=IncidentKind(row.kind),
        opened_at=row.opened_at,
        failures=row.failures,
        first_failure_at=row.first_failure_at,
        last_error=row.last_error,
        paused_at=row.paused_at,
        resolved_at=row.resolved_at,
        resolution=row.resolution,
    )
