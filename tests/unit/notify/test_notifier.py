"""The leader's notifier (``beat.leader.notifier``): one batch at a time, each send
recorded after it; a send that fails is recorded as failed (and tried again later by
the outbox), one that cannot be taken leaves the batch for later."""

from __future__ import annotations

import http.client
from collections.abc import Callable
from typing import Any

import pytest

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

    def notification_failed(self, notification_id: int, error: str, *, epoch: int | None) -> bool:
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
        lambda: [pending(1), pending(2, "https://hooks.example.com/down"), pending(3)],
        outbox,
        epoch=1,
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

    notifier.send_due(take, Outbox(), epoch=1)
    notifier.send_due(take, Outbox(), epoch=1)
    assert len(started) == 1, "the second waits for the first batch"
    started[0]()
    notifier.send_due(take, Outbox(), epoch=1)
    assert len(started) == 2
    assert takes == [1]


def test_a_take_that_fails_leaves_the_notifier_ready_for_the_next() -> None:
    notifier = Notifier(send=lambda *args: None, start=lambda work: work())

    def unreachable() -> list[PendingNotification]:
        raise StoreUnavailable("PostgreSQL is unreachable")

    notifier.send_due(unreachable, Outbox(), epoch=1)
    outbox = Outbox()
    notifier.send_due(lambda: [pending(7)], outbox, epoch=1)
    assert outbox.sent == [7]


def test_a_send_that_raises_anything_fails_alone_and_the_batch_goes_on() -> None:
    """http.client's own errors (a target it refuses, a receiver breaking mid-reply) are
    not OSErrors: one such channel must not hold back the channels after it."""
    delivered: list[int] = []

    def send(kind: ChannelKind, target: str, notification_id: int, payload: dict[str, Any]) -> None:
        if notification_id == 1:
            raise http.client.IncompleteRead(b"partial")
        delivered.append(notification_id)

    outbox = Outbox()
    Notifier(send=send, start=lambda work: work()).send_due(
        lambda: [pending(1), pending(2)], outbox, epoch=1
    )

    assert delivered == [2]
    assert outbox.sent == [2]
    [(failed, error)] = outbox.failed
    assert failed == 1
    assert error.startswith("IncompleteRead")


def test_a_notifier_whose_thread_cannot_start_is_ready_again() -> None:
    def no_threads(work: Callable[[], None]) -> None:
        raise RuntimeError("can't start new thread")

    notifier = Notifier(send=lambda *args: None, start=no_threads)
    with pytest.raises(RuntimeError):
        notifier.send_due(lambda: [pending(1)], Outbox(), epoch=1)
    notifier._start = lambda work: work()
    outbox = Outbox()
    notifier.send_due(lambda: [pending(2)], outbox, epoch=1)
    assert outbox.sent == [2]
