"""What a notification of an incident says: the document a webhook receives, and the
one line a person reads (Slack's text, an email's subject). Pure."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from beat.models import IncidentKind, NotificationEvent

#: The document's version: a receiver may check it.
PAYLOAD_VERSION = 1


def incident_payload(
    event: NotificationEvent,
    *,
    cluster: str,
    incident_id: int,
    schedule: str,
    kind: str,
    failures: int | None,
    last_error: str | None,
    at: datetime,
    resolution: str | None = None,
    detail: str | None = None,
) -> dict[str, Any]:
    """The document of one event of an incident (without the notification's ID, added
    when it is sent). ``detail``: what a stall or a run monitor found."""
    return {
        "version": PAYLOAD_VERSION,
        "cluster": cluster,
        "event": event.value,
        "at": at.astimezone(UTC).isoformat(),
        "incident": {
            "id": incident_id,
            "kind": kind,
            "schedule": schedule,
            "failures": failures,
            "last_error": last_error,
            "resolution": resolution,
            "detail": detail,
        },
        "text": _text(event, kind, schedule, failures, detail, resolution),
    }


def _text(
    event: NotificationEvent,
    kind: str,
    schedule: str,
    failures: int | None,
    detail: str | None,
    resolution: str | None,
) -> str:
    if kind == IncidentKind.STALL:
        return stall_summary(event, detail=detail, resolution=resolution)
    if kind == IncidentKind.FAILING:
        return summary(event, schedule=schedule, failures=failures, resolution=resolution)
    return timing_summary(
        event, IncidentKind(kind), schedule=schedule, detail=detail, resolution=resolution
    )


#: What a run monitor's incident says of its schedule (``beat.monitors.timing``).
_TIMING_HEADLINES = {
    IncidentKind.OVERRAN: "overran",
    IncidentKind.LATE: "is late",
    IncidentKind.MISSED: "missed a fire time",
}
_TIMING_RECOVERIES = {
    IncidentKind.OVERRAN: "no longer overruns",
    IncidentKind.LATE: "is on time again",
    IncidentKind.MISSED: "fires on time again",
}


def timing_summary(
    event: NotificationEvent,
    kind: IncidentKind,
    *,
    schedule: str,
    detail: str | None,
    resolution: str | None,
) -> str:
    """One line for people about a run monitor's incident."""
    if event is NotificationEvent.RESOLVED:
        return f"Schedule {schedule} {_TIMING_RECOVERIES[kind]}: {resolution}"
    return f"Schedule {schedule} {_TIMING_HEADLINES[kind]}: {detail}"


def summary(
    event: NotificationEvent, *, schedule: str, failures: int | None, resolution: str | None
) -> str:
    """One line for people."""
    if event is NotificationEvent.OPENED:
        return f"Schedule {schedule} failed {failures} times in a row"
    if event is NotificationEvent.PAUSED:
        return f"Schedule {schedule} was paused after {failures} failures in a row"
    return f"Schedule {schedule} recovered: {resolution}"


def stall_summary(event: NotificationEvent, *, detail: str | None, resolution: str | None) -> str:
    """One line for people about a stall of the whole cluster."""
    if event is NotificationEvent.RESOLVED:
        return f"Fire times are claimed again: {resolution}"
    return f"No fire time is being claimed: {detail}"


def details(payload: dict[str, Any]) -> str:
    """The lines of an email's body: the summary, then each field."""
    incident = payload["incident"]
    lines = [
        payload["text"],
        "",
        f"schedule:   {incident['schedule']}",
        f"incident:   {incident['id']} ({incident['kind']})",
        f"event:      {payload['event']} at {payload['at']}",
        f"cluster:    {payload['cluster']}",
    ]
    if incident.get("failures") is not None:
        lines.append(f"failures:   {incident['failures']} in a row")
    if incident.get("last_error"):
        lines.append(f"last error: {incident['last_error']}")
    if incident.get("detail"):
        lines.append(f"found:      {incident['detail']}")
    if incident.get("resolution"):
        lines.append(f"resolution: {incident['resolution']}")
    if incident["kind"] == IncidentKind.STALL:
        lines += ["", "celery -A app schedules health"]
    else:
        lines += ["", f"celery -A app schedules show {incident['schedule']}"]
    return "\n".join(lines)
