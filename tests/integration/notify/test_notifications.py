"""The notification outbox against real PostgreSQL and real receivers: written with
the incident's event, one per channel; taken for a send under a lease, fenced by the
epoch (a newer leader takes at once what an older one took); recorded once sent; backed
off when a send fails and given up after a day. The senders post to a real HTTP server
and mail through a real SMTP server (aiosmtpd)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import select, update

from beat.errors import StaleEpoch
from beat.models import ChannelKind, RunState
from beat.notify.senders import SendFailed, send
from beat.ops.schedules import Schedules
from beat.store.all_roles import Store
from beat.store.tables import notifications
from tests.integration.helpers import finished_runs
from tests.receivers import http_receiver, smtp_receiver

pytestmark = pytest.mark.integration

TASK = "tasks.demo.add"
LEASE = timedelta(seconds=60)


@pytest.fixture
def schedules(store: Store) -> Schedules:
    assert store.take_leadership(1, "leader")
    return Schedules(store)


def incident_notified_to_a_webhook(store: Store, schedules: Schedules) -> None:
    """A webhook channel, and an incident opened: one notification in the outbox."""
    schedules.add_webhook("hook", "https://hooks.example.com/habeat")
    schedules.create("flaky", TASK, every=60, allow_unregistered=True)
    finished_runs(store, "flaky", [RunState.FAILED] * 3, error="RuntimeError: down")
    store.watch_failures(1, alert_after=3, pause_after=0, idle_timeout=5)


def take(store: Store, epoch: int = 1, limit: int = 10) -> list[Any]:
    return store.take_notifications(epoch, limit=limit, lease=LEASE, idle_timeout=5)


def outbox(store: Store) -> list[Any]:
    with store.engine.connect() as conn:
        return list(conn.execute(select(notifications).order_by(notifications.c.id)))


def test_each_event_of_an_incident_is_written_once_per_channel(
    store: Store, schedules: Schedules
) -> None:
    schedules.add_webhook("hook", "https://hooks.example.com/habeat")
    schedules.add_slack("chat", "https://hooks.slack.com/services/T/B/X")
    schedules.create("flaky", TASK, every=60, allow_unregistered=True, pause_after_failures=3)
    finished_runs(store, "flaky", [RunState.FAILED] * 3, error="RuntimeError: down")

    store.watch_failures(1, alert_after=3, pause_after=0, idle_timeout=5)
    store.watch_failures(1, alert_after=3, pause_after=0, idle_timeout=5)

    written = outbox(store)
    assert sorted((row.channel, row.event) for row in written) == [
        ("chat", "opened"), ("chat", "paused"), ("hook", "opened"), ("hook", "paused"),
    ]  # fmt: skip
    opened = next(row for row in written if row.event == "opened")
    assert opened.payload["incident"]["schedule"] == "flaky"
    assert opened.payload["incident"]["failures"] == 3
    assert opened.payload["text"] == "Schedule flaky failed 3 times in a row"
    assert opened.payload["cluster"] == store.leader_name


def test_a_notification_is_taken_once_under_its_lease_and_at_once_by_a_newer_leader(
    store: Store, schedules: Schedules
) -> None:
    incident_notified_to_a_webhook(store, schedules)

    [first] = take(store)
    assert (first.kind, first.target, first.attempts) == (
        ChannelKind.WEBHOOK, "https://hooks.example.com/habeat", 1,
    )  # fmt: skip
    assert take(store) == [], "held by its lease"

    assert store.take_leadership(2, "newer")
    with pytest.raises(StaleEpoch):
        take(store, epoch=1)
    [again] = take(store, epoch=2)
    assert (again.id, again.attempts) == (first.id, 2), "the older leader is deposed"

    store.notification_sent(again.id)
    with store.engine.begin() as conn:
        conn.execute(update(notifications).values(next_attempt_at=store.now() - LEASE))
    assert take(store, epoch=2) == [], "sent: never again"


def test_a_failed_send_backs_off_and_is_given_up_after_a_day(
    store: Store, schedules: Schedules
) -> None:
    incident_notified_to_a_webhook(store, schedules)
    [taken] = take(store)

    assert (
        store.notification_failed(taken.id, "webhook: HTTP 503 from the receiver", epoch=1) is False
    )
    [row] = outbox(store)
    assert row.last_error == "webhook: HTTP 503 from the receiver"
    assert row.next_attempt_at - store.now() > timedelta(seconds=8)
    assert take(store) == [], "waits its back-off"

    with store.engine.begin() as conn:
        conn.execute(
            update(notifications).values(
                created_at=store.now() - timedelta(days=1, minutes=1),
                next_attempt_at=store.now() - timedelta(seconds=1),
            )
        )
    [late] = take(store)
    assert store.notification_failed(late.id, "webhook: timed out", epoch=1) is True
    [given_up] = outbox(store)
    assert given_up.given_up_at is not None
    assert take(store) == []


def test_removing_a_channel_drops_its_notifications_not_sent(
    store: Store, schedules: Schedules
) -> None:
    incident_notified_to_a_webhook(store, schedules)

    schedules.remove_channel("hook")

    assert outbox(store) == []
    assert schedules.channels() == []


# -- the senders, against real receivers ----------------------------------------------------

PAYLOAD: dict[str, Any] = {
    "version": 1,
    "cluster": "habeat",
    "event": "opened",
    "at": "2026-12-06T07:27:12+00:00",
    "incident": {
        "id": 4, "kind": "failing", "schedule": "rates", "failures": 3,
        "last_error": "TypeError: boom", "resolution": None,
    },
    "text": "Schedule rates failed 3 times in a row",
}  # fmt: skip


def test_a_webhook_gets_the_document_with_the_notification_s_id_as_its_idempotency_key() -> None:
    with http_receiver() as receiver:
        send(ChannelKind.WEBHOOK, receiver.url("/habeat"), 12, PAYLOAD)
        send(ChannelKind.SLACK, receiver.url("/slack"), 13, PAYLOAD)
        [hook] = receiver.received("/habeat")
        [slack] = receiver.received("/slack")

    assert hook.body == PAYLOAD | {"notification_id": 12}
    assert hook.headers["Idempotency-Key"] == "12"
    assert hook.headers["Content-Type"] == "application/json"
    assert slack.body == {
        "text": "Schedule rates failed 3 times in a row (incident 4, notification 13)"
    }


def test_an_email_is_mailed_through_the_smtp_server_to_each_recipient() -> None:
    with smtp_receiver() as receiver:
        target = f"{receiver.url()}?from=beat%40example.com&to=ops%40example.com&to=b%40example.com"
        send(ChannelKind.EMAIL, target, 21, PAYLOAD)
        [mail] = receiver.mails

    assert mail["Subject"] == "[habeat] Schedule rates failed 3 times in a row"
    assert mail["From"] == "beat@example.com"
    assert mail["To"] == "ops@example.com, b@example.com"
    assert mail["X-Habeat-Notification"] == "21"
    body = mail.get_payload(decode=True)
    assert isinstance(body, bytes)
    assert "last error: TypeError: boom" in body.decode()


@pytest.mark.parametrize("status", [404, 500, 503])
def test_a_receiver_that_refuses_fails_the_send(status: int) -> None:
    with http_receiver() as receiver:
        receiver.status = status
        with pytest.raises(SendFailed, match=f"HTTP {status}"):
            send(ChannelKind.WEBHOOK, receiver.url("/habeat"), 1, PAYLOAD)


def test_a_receiver_that_does_not_answer_fails_the_send() -> None:
    with http_receiver() as receiver:
        closed = receiver.url("/habeat")
    with pytest.raises(SendFailed, match="webhook"):
        send(ChannelKind.WEBHOOK, closed, 1, PAYLOAD)
    with pytest.raises(SendFailed, match="email"):
        send(ChannelKind.EMAIL, "smtp://127.0.0.1:1?from=a%40b.c&to=d%40e.f", 1, PAYLOAD)


@pytest.mark.parametrize("status", [301, 302, 303, 307])
def test_a_redirect_is_a_failed_send_not_followed(status: int) -> None:
    """urllib follows a POST's redirect with a GET without the document; its 200 would
    count as delivered."""
    with http_receiver() as receiver:
        receiver.status, receiver.location = status, receiver.url("/elsewhere")
        with pytest.raises(SendFailed, match=f"HTTP {status}"):
            send(ChannelKind.WEBHOOK, receiver.url("/habeat"), 1, PAYLOAD)
        assert receiver.received("/elsewhere") == []


def test_a_deposed_leader_s_failure_record_changes_nothing(
    store: Store, schedules: Schedules
) -> None:
    incident_notified_to_a_webhook(store, schedules)
    [first] = take(store)
    assert store.take_leadership(2, "newer")
    [again] = take(store, epoch=2)
    assert again.id == first.id

    assert store.notification_failed(first.id, "webhook: timed out", epoch=1) is False

    [row] = outbox(store)
    assert row.last_error is None
    assert row.taken_by_epoch == 2
