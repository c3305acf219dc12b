"""The leader sends the notification outbox (``beat.store.leader.notifications``) on a
thread of its own: a channel that answers slowly (a send may take ``SEND_TIMEOUT``)
never holds up a claim. One batch at a time: taken (fenced by the epoch) under a lease,
sent one by one while the lease leaves time for a send, each send recorded after it, so
a leader that dies in between leaves the notification to be sent again (at least
once)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from beat import metrics
from beat.errors import error_text
from beat.models import ChannelKind
from beat.notify.senders import SEND_TIMEOUT, SendFailed, send
from beat.store.leader.notifications import PendingNotification

logger = logging.getLogger(__name__)

Send = Callable[[ChannelKind, str, int, dict[str, Any]], None]


class Outbox(Protocol):
    """What the notifier records (``beat.store.leader.LeaderStore``)."""

    def notification_sent(self, notification_id: int) -> None: ...
    def notification_failed(
        self, notification_id: int, error: str, *, epoch: int | None
    ) -> bool: ...


def _start_thread(work: Callable[[], None]) -> None:
    threading.Thread(target=work, name="habeat-notifier", daemon=True).start()


class Notifier:
    """Sends the due notifications, one batch at a time."""

    def __init__(
        self,
        send: Send = send,
        start: Callable[[Callable[[], None]], None] = _start_thread,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._send = send
        #: Runs a batch (on a thread of its own, by default).
        self._start = start
        #: Seconds, to tell how much of a batch's lease is left.
        self._clock = clock
        self._lock = threading.Lock()
        #: Set while no batch is being sent (``finish`` waits for it).
        self._idle = threading.Event()
        self._idle.set()

    def send_due(
        self,
        take: Callable[[], list[PendingNotification]],
        outbox: Outbox,
        *,
        epoch: int | None,
    ) -> None:
        """Start sending what ``take`` takes (as leader ``epoch``, or None for a process
        that does not lead), unless a batch is being sent."""
        with self._lock:
            if not self._idle.is_set():
                return  # a batch is being sent
            self._idle.clear()

        def work() -> None:
            try:
                self._send_batch(take, outbox, epoch)
            except Exception as exc:
                # Taken and not recorded: sent again once its lease ends (or by a newer
                # leader at once). Nothing is lost; the claims go on.
                logger.warning("could not send the notifications: %s", error_text(exc))
            finally:
                self._done()

        try:
            self._start(work)
        except BaseException:
            self._done()  # no thread to clear it (too many threads, shutting down)
            raise

    def finish(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for the batch being sent, if any (a process
        closing: its connections are about to be closed under the batch's feet). True
        once none is."""
        return self._idle.wait(timeout)

    def _done(self) -> None:
        self._idle.set()

    def _send_batch(
        self, take: Callable[[], list[PendingNotification]], outbox: Outbox, epoch: int | None
    ) -> None:
        """Send what ``take`` takes, one by one, until less than a send's time is left
        of the lease it was taken under: a send started later could still be under way
        when another process takes the notification again, and a slow channel would
        hold this thread far past the lease. The rest are left as taken, to be taken
        again once the lease ends, like a notification whose send was never recorded."""
        # Read before the take: the lease starts later, at the take's time in the database.
        taken_at = self._clock()
        taken = take()
        for index, notification in enumerate(taken):
            if taken_at + notification.lease.total_seconds() - self._clock() < SEND_TIMEOUT:
                _said_left(taken[index:])
                return
            self._deliver(notification, outbox, epoch)

    def _deliver(
        self, notification: PendingNotification, outbox: Outbox, epoch: int | None
    ) -> None:
        kind = notification.kind.value
        try:
            self._send(
                notification.kind, notification.target, notification.id, notification.payload
            )
        except Exception as exc:
            # Whatever the send raised (a receiver that breaks mid-reply, a target that
            # http.client refuses): this notification failed, the batch goes on, so one
            # bad channel never holds back the others.
            failure = exc if isinstance(exc, SendFailed) else SendFailed(_described(exc))
            metrics.NOTIFICATION_FAILURES.labels(kind=kind).inc()
            given_up = outbox.notification_failed(notification.id, str(failure), epoch=epoch)
            _said_failed(notification, failure, given_up=given_up)
            return
        metrics.NOTIFICATIONS_SENT.labels(kind=kind).inc()
        outbox.notification_sent(notification.id)


def _described(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"[:500]


def _said_left(notifications: Sequence[PendingNotification]) -> None:
    logger.warning(
        "%d notifications left to send after their lease ends: less than a send's time"
        " (%gs) was left of it (a slow channel?)",
        len(notifications),
        SEND_TIMEOUT,
        extra={"notifications": [notification.id for notification in notifications]},
    )


def _said_failed(notification: PendingNotification, exc: SendFailed, *, given_up: bool) -> None:
    if given_up:
        metrics.NOTIFICATIONS_GIVEN_UP.inc()
    logger.warning(
        "notification %d to channel %s not sent (attempt %d): %s%s",
        notification.id,
        notification.channel,
        notification.attempts,
        error_text(exc),
        "; given up: its sends have failed for a day" if given_up else "; tried again later",
        extra={"notification": notification.id, "channel": notification.channel},
    )
