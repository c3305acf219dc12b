"""Documents and text of the incidents (``schedules incidents``)."""

from __future__ import annotations

from typing import Any

from beat.models import Incident
from beat.ops.rendering import _truncate, iso, table, time_text


def incident_document(incident: Incident) -> dict[str, Any]:
    return {
        "id": incident.id,
        "schedule": incident.schedule_name,
        "kind": incident.kind.value,
        "open": incident.open,
        "opened_at": iso(incident.opened_at),
        "failures": incident.failures,
        "first_failure_at": iso(incident.first_failure_at),
        "last_error": incident.last_error,
        "paused_at": iso(incident.paused_at),
        "resolved_at": iso(incident.resolved_at),
        "resolution": incident.resolution,
    }


def incidents_text(incidents: list[Incident], *, include_resolved: bool) -> str:
    if not incidents:
        return "no incidents" if include_resolved else "no open incidents"
    rows = [
        (
            str(incident.id),
            incident.schedule_name,
            incident.kind.value,
            time_text(incident.opened_at),
            str(incident.failures),
            _state_text(incident),
            _truncate(incident.last_error or "-"),
        )
        for incident in incidents
    ]
    columns = ("ID", "SCHEDULE", "KIND", "OPENED (UTC)", "FAILURES", "STATE", "LAST ERROR")
    return table(columns, rows)


def _state_text(incident: Incident) -> str:
    if incident.resolved_at is not None:
        return f"resolved {time_text(incident.resolved_at)}: {incident.resolution}"
    if incident.paused_at is not None:
        return f"open, schedule paused {time_text(incident.paused_at)}"
    return "open"
