"""One send at a time on a thread of its own, so that the leader's next claim
overlaps it.

During a burst the leader claims a batch, publishes it and marks it published,
batch after batch. Publishing is mostly Python (building messages) and the claim
mostly waiting for PostgreSQL (which releases the GIL): run side by side, a batch's
send costs little more than the wait for the next batch's rows. Only one send is in
flight, so a batch's runs are sent in claim order and a failure stops what follows,
as when the loop sends them itself.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

logger = logging.getLogger(__name__)

#: Seconds a shutdown waits for the send in flight (one batch takes tens of
#: milliseconds): past that the broker has stopped answering, and the hand-over
#: does not wait for it.
SHUTDOWN_WAIT = 2.0


class OverlappedSend:
    """At most one send in flight; ``finish`` waits for it and raises what it raised."""

    def __init__(self) -> None:
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    @property
    def in_flight(self) -> bool:
        return self._thread is not None

    def start(self, send: Callable[[], None]) -> None:
        """Finish the send in flight (raising its error, if any), then start ``send``."""
        self.finish()
        self._thread = threading.Thread(
            target=self._run, args=(send,), name="habeat-send", daemon=True
        )
        self._thread.start()

    def finish(self) -> None:
        """Wait for the send in flight, if any; raise the error it raised."""
        thread = self._thread
        if thread is None:
            return
        # Forgotten only once it has ended: a signal handler that runs meanwhile (beat
        # shuts down from SIGTERM's handler, on this thread) must wait for it too.
        thread.join()
        self._thread = None
        error, self._error = self._error, None
        if error is not None:
            raise error

    def finish_quietly(self, timeout: float | None = None) -> None:
        """Wait for the send in flight while something else is being raised or the
        process stops: its own error is logged, not raised (the outbox keeps the runs
        it did not send). With ``timeout``, a send that has not ended by then (a
        broker that stopped answering) is left behind, said so, and not waited for."""
        thread = self._thread
        if thread is None:
            return
        thread.join(timeout)
        if thread.is_alive():
            logger.error(
                "the send in flight has not ended after %.1fs: not waiting for it"
                " (its runs stay in the outbox)",
                timeout,
            )
            return
        try:
            self.finish()
        except Exception as exc:
            logger.error("the send in flight failed as well: %s", exc)

    def _run(self, send: Callable[[], None]) -> None:
        try:
            send()
        except BaseException as exc:  # handed to the loop's thread by finish()
            self._error = exc
