"""The notification outbox as the leader sends it (``beat.leader.notifier``): due
notifications taken for a send, held for it by a lease, and the outcome of each send.

A notification is sent at least once: the leader records a send after it, so one that
dies in between (or whose record fails) leaves it to be sent again. Taking one is fenced
by the leader's epoch; a notification an older leader took and did not record is taken
at once by a newer one, without waiting for the lease (the older one may be sending it
still: the receiver may see it twice, never lose it). Every time is the database's.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Connection, case, func, literal, or_, select, text, update

from beat.models import ChannelKind, IncidentKind, NotificationEvent
from beat.monitors.messages import incident_payload
from beat.store.leader.base import FencedStore
from beat.store.tables import channels, notifications

#: A notification is given up once its sends have failed for this long.
GIVE_UP_AFTER = timedelta(days=1)
#: The back-off after a failed send: doubled each attempt, from FIRST_RETRY to LAST_RETRY.
FIRST_RETRY = timedelta(seconds=10)
LAST_RETRY = timedelta(minutes=15)

#: The back-off stops doubling after this many attempts (LAST_RETRY is reached before).
_DOUBLINGS = 10


@dataclass(frozen=True, kw_only=True, slots=True)
class PendingNotification:
    """A notification taken for a send."""

    id: int
    channel: str
    kind: ChannelKind
    target: str
    payload: dict[str, Any]
    attempts: int
    #: How long it is held for this send, from the take: past it, any process may take
    #: it again, so a send started late could reach the receiver twice.
    lease: timedelta


def enqueue_notifications(
    conn: Connection,
    event: NotificationEvent,
    incident_id: int,
    payload: dict[str, Any],
    *,
    schedule_id: int | None = None,
) -> None:
    """One notification of an incident's event per channel, in the outbox, in the
    caller's transaction (the one that changes the incident): to the channels schedule
    ``schedule_id`` names that are still there; without a schedule (removed since, or
    the cluster's stall), to those told the incident opened; else (none named, none of
    them left) to every channel, so that an incident is never told to nobody."""
    conn.execute(
        text(_ENQUEUE_SQL),
        {
            "schedule_id": schedule_id,
            "incident_id": incident_id,
            "event": event.value,
            "payload": json.dumps(payload),
        },
    )


def notify_incident(
    conn: Connection,
    event: NotificationEvent,
    *,
    cluster: str,
    incident_id: int,
    schedule: str,
    schedule_id: int | None,
    kind: IncidentKind,
    at: datetime,
    failures: int | None = None,
    last_error: str | None = None,
    resolution: str | None = None,
    detail: str | None = None,
) -> None:
    """The notifications of one event of an incident (``beat.monitors.messages``), in
    the caller's transaction."""
    payload = incident_payload(
        event,
        cluster=cluster,
        incident_id=incident_id,
        schedule=schedule,
        kind=kind.value,
        failures=failures,
        last_error=last_error,
        at=at,
        resolution=resolution,
        detail=detail,
    )
    enqueue_notifications(conn, event, incident_id, payload, schedule_id=schedule_id)


_ENQUEUE_SQL = """
WITH routed AS (
    SELECT coalesce(
        CASE WHEN CAST(:schedule_id AS bigint) IS NOT NULL
             THEN (SELECT channels FROM beat_schedules WHERE id = :schedule_id)
             ELSE (SELECT array_agg(DISTINCT channel) FROM beat_notifications
                   WHERE incident_id = :incident_id AND event = 'opened')
        END,
        '{}'::text[]
    ) AS names
)
INSERT INTO beat_notifications (channel, incident_id, event, payload)
SELECT c.name, :incident_id, :event, CAST(:payload AS jsonb)
FROM beat_channels AS c, routed
WHERE c.name = ANY(routed.names)
   OR NOT EXISTS (SELECT 1 FROM beat_channels AS named WHERE named.name = ANY(routed.names))
"""


class NotificationStatements(FencedStore):
    """The outbox's due notifications, and what became of their sends."""

    def take_notifications(
        self,
        epoch: int | None,
        *,
        limit: int,
        lease: timedelta,
        idle_timeout: float,
        overdue_by: timedelta = timedelta(0),
    ) -> list[PendingNotification]:
        """Up to ``limit`` notifications due ``overdue_by`` ago or more, oldest first,
        held for ``lease`` (no other send takes them meanwhile, but a newer leader's).
        As leader ``epoch`` (StaleEpoch if a newer one exists), or, with None, as a
        process that does not lead: it takes only what the leader left (``overdue_by``),
        so that notifications go out while no process leads."""
        table = notifications
        with self._transaction() as conn:
            if epoch is not None:
                self._fence(conn, epoch, idle_timeout)
            due_at = func.now() - func.make_interval(0, 0, 0, 0, 0, 0, overdue_by.total_seconds())
            taken_earlier = table.c.taken_by_epoch < epoch if epoch is not None else literal(False)
            due = (
                select(table.c.id)
                .where(
                    table.c.sent_at.is_(None),
                    table.c.given_up_at.is_(None),
                    or_(table.c.next_attempt_at <= due_at, taken_earlier),
                )
                .order_by(table.c.next_attempt_at, table.c.id)
                .limit(limit)
                .with_for_update(skip_locked=True)
                .scalar_subquery()
            )
            taken = conn.execute(
                update(table)
                .where(table.c.id.in_(due))
                .values(
                    next_attempt_at=func.now() + lease,
                    attempts=table.c.attempts + 1,
                    taken_by_epoch=epoch,
                )
                .returning(table.c.id, table.c.channel, table.c.payload, table.c.attempts)
            ).all()
            found = {
                row.name: row
                for row in conn.execute(
                    select(channels.c.name, channels.c.kind, channels.c.target).where(
                        channels.c.name.in_({row.channel for row in taken})
                    )
                )
            }
        return [
            PendingNotification(
                id=row.id,
                channel=row.channel,
                kind=ChannelKind(found[row.channel].kind),
                target=found[row.channel].target,
                payload=row.payload,
                attempts=row.attempts,
                lease=lease,
            )
            for row in sorted(taken, key=lambda row: row.id)
        ]

    def notification_sent(self, notification_id: int) -> None:
        """Record a send that the channel took. Not fenced: it records a fact, whoever
        leads now, and spares the receiver a second copy."""
        with self._transaction() as conn:
            conn.execute(
                update(notifications)
                .where(notifications.c.id == notification_id)
                .values(sent_at=func.now(), last_error=None)
            )

    def notification_failed(self, notification_id: int, error: str, *, epoch: int | None) -> bool:
        """Record a send that failed, as the process that took it (leader ``epoch``, or
        None): tried again after its back-off, or given up once its sends have failed for
        ``GIVE_UP_AFTER``. True if given up. A newer leader that took it meanwhile owns
        it: the record of a deposed one changes nothing."""
        table = notifications
        doublings = func.least(func.greatest(table.c.attempts - 1, 0), _DOUBLINGS)
        backoff = func.least(
            _interval(FIRST_RETRY) * func.power(2, doublings), _interval(LAST_RETRY)
        )
        expired = func.now() >= table.c.created_at + GIVE_UP_AFTER
        with self._transaction() as conn:
            given_up: bool | None = conn.execute(
                update(table)
                .where(
                    table.c.id == notification_id,
                    table.c.sent_at.is_(None),
                    table.c.taken_by_epoch.is_not_distinct_from(epoch),
                )
                .values(
                    last_error=error[:500],
                    next_attempt_at=func.now() + backoff,
                    given_up_at=case((expired, func.now()), else_=None),
                )
                .returning(table.c.given_up_at.is_not(None))
            ).scalar_one_or_none()
        return bool(given_up)


def _interval(length: timedelta) -> Any:
    return func.make_interval(0, 0, 0, 0, 0, 0, length.total_seconds())
