"""The incidents as operators read them: the CLI, ``schedules health`` and the UI."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import Row, Select, func, select

from beat.models import Incident, IncidentKind
from beat.store.leader.base import FencedStore
from beat.store.tables import incidents, schedules


@dataclass(frozen=True, kw_only=True, slots=True)
class IncidentList:
    """Incidents newest first, as the UI's incidents page lists them."""

    incidents: list[Incident]
    #: The IDs of those whose schedule is still there, so its page can be linked: not
    #: the cluster's stall incident, nor those of a schedule since removed.
    with_schedule: frozenset[int]

    def has_schedule(self, incident: Incident) -> bool:
        return incident.id in self.with_schedule


class IncidentReads(FencedStore):
    """Reads of ``beat_incidents``; nothing here writes."""

    def incidents(
        self, *, include_resolved: bool = False, limit: int = 100, schedule: str | None = None
    ) -> list[Incident]:
        """Incidents newest first: the open ones, or all with ``include_resolved``;
        ``schedule``: only those of the schedule of that name."""
        with self._transaction() as conn:
            found = conn.execute(_listed(include_resolved, limit, schedule))
            return [incident_from_row(row) for row in found]

    def incident_list(self, *, include_resolved: bool = False, limit: int = 100) -> IncidentList:
        """:meth:`incidents`, with which of them have a schedule still there."""
        with self._transaction() as conn:
            found = list(conn.execute(_listed(include_resolved, limit, None)))
        return IncidentList(
            incidents=[incident_from_row(row) for row in found],
            # the schedule's removal set it NULL; the cluster's stall incident has none
            with_schedule=frozenset(row.id for row in found if row.schedule_id is not None),
        )

    def open_incident_count(self) -> int:
        """How many incidents are open, of every kind."""
        query = select(func.count()).select_from(incidents).where(incidents.c.resolved_at.is_(None))
        with self._transaction() as conn:
            count: int = conn.execute(query).scalar_one()
            return count


def _listed(include_resolved: bool, limit: int, schedule: str | None) -> Select[Any]:
    query = select(incidents).order_by(incidents.c.opened_at.desc(), incidents.c.id.desc())
    if not include_resolved:
        query = query.where(incidents.c.resolved_at.is_(None))
    if schedule is not None:
        # By the schedule's ID, not by name: the cluster's stall incident goes by a name
        # a schedule may have too, and a schedule removed then created again under the
        # same name does not inherit the old one's incidents.
        schedule_id = select(schedules.c.id).where(schedules.c.name == schedule)
        query = query.where(incidents.c.schedule_id == schedule_id.scalar_subquery())
    return query.limit(limit)


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
