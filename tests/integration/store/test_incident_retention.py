"""Retention of incidents and their notifications against real PostgreSQL
(``beat.store.leader.retention``): the prune that deletes old finished runs deletes,
with the same cutoff, incidents resolved before it and notifications sent or given up
before it; never an open incident, never a notification still to be sent, nor the
incident it belongs to. Times are moved into the past with SQL, by the database's clock.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy import text

from beat.models import RunState
from beat.ops.schedules import Schedules
from beat.store.all_roles import Store
from tests.integration.helpers import finished_runs

pytestmark = pytest.mark.integration

TASK = "tasks.demo.add"
RETENTION = timedelta(days=30)
OLD = RETENTION + timedelta(days=1)
RECENT = RETENTION - timedelta(days=1)


@pytest.fixture
def schedules(store: Store) -> Schedules:
    assert store.take_leadership(1, "leader")
    return Schedules(store)


def incident(store: Store, schedules: Schedules, name: str, *, resolved: bool) -> int:
    """The incident schedule ``name`` opens by failing three times in a row (and a
    success resolves, if ``resolved``), told to every channel: its ID."""
    schedules.create(name, TASK, every=60, allow_unregistered=True)
    finished_runs(store, name, [RunState.FAILED] * 3)
    store.watch_failures(1, alert_after=3, pause_after=0, idle_timeout=5)
    if resolved:
        finished_runs(store, name, [RunState.SUCCEEDED])
        store.watch_failures(1, alert_after=3, pause_after=0, idle_timeout=5)
    with store.engine.connect() as conn:
        return int(
            conn.execute(
                text("SELECT id FROM beat_incidents WHERE schedule_name = :name"), {"name": name}
            ).scalar_one()
        )


def back_date(store: Store, incident_id: int, ago: timedelta) -> None:
    """Incident ``incident_id`` opened, and resolved if it is, ``ago`` before now."""
    with store.engine.begin() as conn:
        conn.execute(
            text(
                "UPDATE beat_incidents SET opened_at = now() - :ago,"
                " resolved_at = CASE WHEN resolved_at IS NULL THEN NULL ELSE now() - :ago END"
                " WHERE id = :id"
            ),
            {"id": incident_id, "ago": ago},
        )


def settled(
    store: Store, incident_id: int, channel: str, ago: timedelta, *, given_up: bool = False
) -> None:
    """The notifications of incident ``incident_id`` to ``channel`` sent (or given up)
    ``ago`` before now."""
    column = "given_up_at" if given_up else "sent_at"
    with store.engine.begin() as conn:
        conn.execute(
            text(
                f"UPDATE beat_notifications SET {column} = now() - :ago"
                " WHERE incident_id = :id AND channel = :channel"
            ),
            {"id": incident_id, "channel": channel, "ago": ago},
        )


def incidents_left(store: Store) -> list[int]:
    with store.engine.connect() as conn:
        return list(conn.execute(text("SELECT id FROM beat_incidents ORDER BY id")).scalars())


def notifications_left(store: Store) -> list[tuple[int, str, str]]:
    """(incident, channel, event) of each notification left."""
    with store.engine.connect() as conn:
        rows = conn.execute(
            text("SELECT incident_id, channel, event FROM beat_notifications ORDER BY id")
        )
        return [(row.incident_id, row.channel, row.event) for row in rows]


def test_an_incident_resolved_before_the_cutoff_goes_with_its_sent_notifications(
    store: Store, schedules: Schedules
) -> None:
    schedules.add_webhook("hook", "https://hooks.example.com/habeat")
    old = incident(store, schedules, "old", resolved=True)
    back_date(store, old, OLD)
    settled(store, old, "hook", OLD)
    # Its "resolved" notification went out late, after retries: it goes with the incident.
    with store.engine.begin() as conn:
        conn.execute(
            text(
                "UPDATE beat_notifications SET sent_at = now() - interval '1 hour'"
                " WHERE incident_id = :id AND event = 'resolved'"
            ),
            {"id": old},
        )

    report = store.prune(RETENTION)

    assert incidents_left(store) == []
    assert notifications_left(store) == []
    assert (report.incidents, report.notifications, report.caught_up) == (1, 2, True)


def test_an_open_incident_stays_however_old(store: Store, schedules: Schedules) -> None:
    still_open = incident(store, schedules, "still-open", resolved=False)
    back_date(store, still_open, timedelta(days=3650))
    resolved = incident(store, schedules, "resolved", resolved=True)
    back_date(store, resolved, OLD)

    report = store.prune(RETENTION)

    assert incidents_left(store) == [still_open]
    assert report.incidents == 1


def test_an_old_resolved_incident_stays_while_a_notification_of_it_is_pending(
    store: Store, schedules: Schedules
) -> None:
    """Deleting the incident would delete its notifications with it (ON DELETE CASCADE):
    one not sent yet would never be."""
    schedules.add_webhook("hook", "https://hooks.example.com/habeat")
    told = incident(store, schedules, "told", resolved=True)
    untold = incident(store, schedules, "untold", resolved=True)
    for found in (told, untold):
        back_date(store, found, OLD)
        settled(store, found, "hook", OLD)
    with store.engine.begin() as conn:  # the receiver of its "resolved" was down
        conn.execute(
            text(
                "UPDATE beat_notifications SET sent_at = NULL"
                " WHERE incident_id = :id AND event = 'resolved'"
            ),
            {"id": untold},
        )

    report = store.prune(RETENTION)

    assert incidents_left(store) == [untold]
    assert notifications_left(store) == [(untold, "hook", "resolved")]
    assert (report.incidents, report.caught_up) == (1, True)


def test_an_incident_resolved_within_the_retention_stays(
    store: Store, schedules: Schedules
) -> None:
    recent = incident(store, schedules, "recent", resolved=True)
    back_date(store, recent, RECENT)
    old = incident(store, schedules, "old", resolved=True)
    back_date(store, old, OLD)

    store.prune(RETENTION)

    assert incidents_left(store) == [recent]


def test_notifications_settled_before_the_cutoff_go_and_pending_ones_stay(
    store: Store, schedules: Schedules
) -> None:
    """Of an incident still open: its notifications sent or given up before the cutoff go,
    one sent since stays, and one not sent yet stays however old."""
    for channel in ("sent", "given-up", "recent", "pending"):
        schedules.add_webhook(channel, f"https://hooks.example.com/{channel}")
    still_open = incident(store, schedules, "flaky", resolved=False)
    back_date(store, still_open, OLD)
    settled(store, still_open, "sent", OLD)
    settled(store, still_open, "given-up", OLD, given_up=True)
    settled(store, still_open, "recent", RECENT)
    with store.engine.begin() as conn:
        conn.execute(text("UPDATE beat_notifications SET created_at = now() - :ago"), {"ago": OLD})

    report = store.prune(RETENTION)

    assert incidents_left(store) == [still_open]
    assert sorted(notifications_left(store)) == [
        (still_open, "pending", "opened"),
        (still_open, "recent", "opened"),
    ]
    assert (report.incidents, report.notifications) == (0, 2)


def test_old_incidents_go_batch_after_batch_within_the_budget(
    store: Store, schedules: Schedules
) -> None:
    """A spent budget starts no other batch, yet each prune deletes one: however many
    old runs are left, incidents go too."""
    doomed = [incident(store, schedules, f"s{index}", resolved=True) for index in range(3)]
    for found in doomed:
        back_date(store, found, OLD)

    first = store.prune(RETENTION, batch=2, budget=0.0)
    rest = store.prune(RETENTION, batch=2, budget=0.0)

    assert (first.incidents, first.caught_up) == (2, False)
    assert (rest.incidents, rest.caught_up) == (1, True)
    assert incidents_left(store) == []
