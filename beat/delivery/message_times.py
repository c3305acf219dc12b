"""The times a message of beat's run carries, read as instants: the run's expiry
(``EXPIRES_HEADER``, by the database's clock), a retry's due instant
(``DUE_HEADER``), and a countdown or an ETA as seconds from now."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from celery.exceptions import Retry

#: The header that keeps a run's expiry instant (the database's clock) once ``expires``
#: is moved onto a worker's clock for Celery's own check.
EXPIRES_HEADER = "habeat_expires"
#: The header that carries a message's due instant by the database's clock, with the
#: ``eta`` it stands for (a retry copies its parent's headers: an instant whose ``eta``
#: is not the message's is an earlier one's).
DUE_HEADER = "habeat_due"


def retry_delay(retry: Retry) -> float:
    """Seconds until the retry Celery published is due (its countdown or ETA)."""
    return seconds_until(retry.when)


def seconds_until(when: Any) -> float:
    """A countdown (seconds) or an ETA (datetime) as seconds from now; 0 if neither."""
    if isinstance(when, str):
        try:
            when = datetime.fromisoformat(when)
        except ValueError:
            return 0.0
    if isinstance(when, int | float):
        return float(when)
    if isinstance(when, datetime):
        aware = when if when.tzinfo else when.replace(tzinfo=UTC)
        return (aware - datetime.now(UTC)).total_seconds()
    return 0.0


def run_expiry(fields: Mapping[str, Any]) -> datetime | None:
    """When the run of a delivery (its headers, or a task's request) expires, by the
    database's clock: the instant beat put in the message; None if it has none."""
    return _instant(fields.get(EXPIRES_HEADER) or fields.get("expires"))


def retry_due(fields: Mapping[str, Any]) -> datetime | None:
    """When a delivery with an ``eta`` (a retry) is due by the database's clock, as the
    worker that sent it put it in ``DUE_HEADER``; None if it has no ``eta``, or no
    instant for that ``eta``."""
    carried, eta = fields.get(DUE_HEADER), fields.get("eta")
    if not eta or not isinstance(carried, Mapping) or carried.get("eta") != eta:
        return None
    return _instant(carried.get("due"))


def _instant(when: Any) -> datetime | None:
    """An instant written in a message (ISO 8601), aware; None if it is not one."""
    if isinstance(when, str):
        try:
            when = datetime.fromisoformat(when)
        except ValueError:
            return None
    if not isinstance(when, datetime):
        return None
    return when if when.tzinfo else when.replace(tzinfo=UTC)
