"""The leader's notifier (``beat.leader.notifier``): one batch at a time, each send
recorded after it; a send that fails is recorded as failed (and tried again later by
the outbox), one that cannot be taken leaves the batch for later."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from beat.errors import StoreUnavailable
from beat.leader.notifier import Notifier
from beat.models import ChannelKind
from beat.notify.senders import SendFailed
from beat.store.leader.notifications import PendingNotification


def pending(
    notification_id: int, target: str = "https://hooks.example.com/a"
) -> PendingNotification:
    return PendingNotification(
        id=notification_id,
        channel="ops",
        kind=ChannelKind.WEBHOOK,
        target=target,
        payload={"text": "x"},
        attempts=1,
    )


class Outbox:
    def __init__(self) -> None:
        self.sent: list[int] = []
        self.failed: list[tuple[int, str]] = []

    def notification_sent(self, notification_id: int) -> None:
        self.sent.append(notification_id)

    def notification_failed(self, notification_id: int, error: str) -> bool:
        self.failed.append((notification_id, error))
        return False


def test_each_send_is_recorded_after_it_and_a_failed_one_as_failed() -> None:
    delivered: list[int] = []

    def send(kind: ChannelKind, target: str, notification_id: int, payload: dict[str, Any]) -> None:
        if target.endswith("/down"):
            raise SendFailed("webhook: HTTP 503 from the receiver")
        delivered.append(notification_id)

    outbox = Outbox()
    notifier = Notifier(send=send, start=lambda work: work())
    notifier.send_due(
        lambda: [pending(1), pending(2, "https://hooks.example.com/down"), pending(3)], outbox
    )

    assert delivered == [1, 3]
    assert outbox.sent == [1, 3]
    assert outbox.failed == [(2, "webhook: HTTP 503 from the receiver")]


def test_a_batch_being_sent_is_not_joined_by_another() -> None:
    started: list[Callable[[], None]] = []
    notifier = Notifier(send=lambda *args: None, start=started.append)
    takes: list[int] = []

    def take() -> list[PendingNotification]:
        takes.append(1)
        return [pending(1)]

    notifier.send_due(take, Outbox())
    notifier.send_due(take, Outbox())
    assert len(started) == 1, "the second waits for the first batch"
    started[0]()
    notifier.send_due(take, Outbox())
    assert len(started) == 2
    assert takes == [1]


def test_a_take_that_fails_leaves_the_notifier_ready_for_the_next() -> None:
    notifier = Notifier(send=lambda *args: None, start=lambda work: work())

    def unreachable() -> list[PendingNotification]:
        raise StoreUnavailable("PostgreSQL is unreachable")

    notifier.send_due(unreachable, Outbox())
    outbox = Outbox()
    notifier.send_due(lambda: [pending(7)], outbox)
    assert outbox.sent == [7]
