"""The leader's notifier (``beat.leader.notifier``): one batch at a time, each send
recorded after it; a send that fails is recorded as failed (and tried again later by
the outbox), one that cannot be taken leaves the batch for later, and no send starts
once less than a send's time is left of the lease the batch was taken under."""

from __future__ import annotations

import http.client
import threading
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest

from beat.errors import StoreUnavailable
from beat.leader.notifier import Notifier
from beat.models import ChannelKind
from beat.notify.senders import SEND_TIMEOUT, SendFailed
from beat.store.leader.notifications import PendingNotification
from tests.fakes import ManualClock

#: The lease a batch is taken under (the leader's is longer: ``NOTIFY_LEASE``).
LEASE = timedelta(seconds=3 * SEND_TIMEOUT)


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
        lease=LEASE,
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


def test_no_send_starts_once_less_than_a_send_s_time_is_left_of_the_lease() -> None:
    """Each send takes half a send's time: those starting with a send's time or more
    left of the lease go, the rest are neither sent nor recorded (they stay taken, and
    are taken again once the lease ends)."""
    clock = ManualClock()
    started: list[float] = []

    def slow(kind: ChannelKind, target: str, notification_id: int, payload: dict[str, Any]) -> None:
        started.append(clock())
        clock.advance(SEND_TIMEOUT / 2)

    outbox = Outbox()
    notifier = Notifier(send=slow, start=lambda work: work(), clock=clock)
    taken_at = clock()
    notifier.send_due(lambda: [pending(index) for index in range(1, 11)], outbox, epoch=1)

    lease_ends = taken_at + LEASE.total_seconds()
    assert [lease_ends - at for at in started] == [30.0, 25.0, 20.0, 15.0, 10.0]
    assert outbox.sent == [1, 2, 3, 4, 5]
    assert outbox.failed == []
    notifier.send_due(lambda: [pending(6)], outbox, epoch=1)
    assert outbox.sent[-1] == 6, "the next batch has a lease of its own"


def test_the_lease_counts_from_before_the_take() -> None:
    """A take that keeps PostgreSQL busy most of the lease leaves no time to send."""
    clock = ManualClock()

    def slow_take() -> list[PendingNotification]:
        clock.advance(LEASE.total_seconds() - SEND_TIMEOUT + 0.5)
        return [pending(1)]

    outbox = Outbox()
    Notifier(send=lambda *args: None, start=lambda work: work(), clock=clock).send_due(
        slow_take, outbox, epoch=1
    )

    assert (outbox.sent, outbox.failed) == ([], [])


def test_a_closing_process_waits_for_the_batch_being_sent() -> None:
    """``finish`` (called as the scheduler closes) waits for the batch on the notifier's
    thread, so the store's pool is not closed under a send: a connection that batch
    holds would be left open."""
    started, release = threading.Event(), threading.Event()

    def slow(kind: ChannelKind, target: str, notification_id: int, payload: dict[str, Any]) -> None:
        started.set()
        release.wait(5)

    notifier = Notifier(send=slow)
    outbox = Outbox()
    notifier.send_due(lambda: [pending(1)], outbox, epoch=1)
    assert started.wait(5)

    assert not notifier.finish(timeout=0.05), "a batch is being sent"
    release.set()
    assert notifier.finish(timeout=5)
    assert outbox.sent == [1]
    assert notifier.finish(timeout=0), "idle: nothing to wait for"
