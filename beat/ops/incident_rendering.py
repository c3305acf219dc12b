"""Documents and text of the incidents (``schedules incidents``) and of the channels
they are notified to (``schedules channels``)."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from beat.models import Channel, ChannelKind, Incident
from beat.ops.rendering import _truncate, iso, table, time_text
from beat.store.db import masked_url


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


def channel_document(channel: Channel) -> dict[str, Any]:
    """A channel, its target's secrets hidden: an SMTP URL's password; a webhook's path
    and query (a Slack incoming webhook's path is its secret)."""
    return {
        "name": channel.name,
        "kind": channel.kind.value,
        "target": shown_target(channel),
        "state": channel.state,
        "pending": channel.pending,
        "failing": channel.failing,
        "given_up": channel.given_up,
        "last_error": channel.last_error,
        "last_sent_at": iso(channel.last_sent_at),
    }


def channel_state_text(channel: Channel) -> str:
    """How a channel's sends go, in one line."""
    if channel.failing:
        return (
            f"failing: {channel.failing} of {channel.pending} to send failed, the last with"
            f" {_truncate(channel.last_error or '-')}"
        )
    if channel.given_up:
        return f"gave up {channel.given_up} after a day of failed sends"
    last = "-" if channel.last_sent_at is None else f"{time_text(channel.last_sent_at)} UTC"
    return f"ok, last sent {last}"


def shown_target(channel: Channel) -> str:
    if channel.kind is ChannelKind.EMAIL:
        return masked_url(channel.target)
    parts = urlsplit(channel.target)
    hidden = "/***" if parts.path.strip("/") or parts.query else ""
    return masked_url(f"{parts.scheme}://{parts.netloc}{hidden}")
