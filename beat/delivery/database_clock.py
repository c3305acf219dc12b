"""Celery's checks of a message's times, moved onto the database's clock.

- **Expiry, by the database's clock**: a run with ``expires`` is expired when
  PostgreSQL's ``now()`` has reached its expiry instant (fire time + ``expires``,
  put in the message by beat, so computed from stored values, not from a
  clock). The receipt and the start of plain and idempotent runs check it in
  the statement that takes or starts the run; a delivery that finds its run
  expired ends it ``expired`` and does not run it. A worker's own clock decides
  nothing. Celery, though, discards a message whose ``expires`` passed by the
  worker's clock before any handler of ours sees it (in its strategy, and again
  when an ETA comes). So, before Celery reads a message of beat's, the consumer
  step ``TimesOnTheDatabaseClock`` moves the ``expires`` header onto this
  worker's clock: the instant plus how far this clock reads ahead of
  PostgreSQL's (``WorkerClock``: the server's ``clock_timestamp()`` against the
  midpoint of the local clock around the round trip, plus half that round trip,
  plus a margin), keeping the instant itself in ``habeat_expires`` for our own
  checks (and for a retry's message, which carries it on). Celery's check then
  fires only once the database's clock has passed the expiry too; our checks
  decide before it. If Celery discards a delivery anyway (the clock jumped since
  it was measured, or PostgreSQL was unreachable to measure it), no task code of
  that delivery ran: the database's clock decides (``RunStore.end_discarded``):
  expired, the run ends ``expired``; not, it goes back to the leader's outbox to
  be sent again (not before a retry is due), and Celery's memory of the ID as
  revoked is cleared so this worker takes the next delivery.
- **Retries' due times, by the database's clock**: Celery writes a retry's ETA
  (``self.retry(countdown=...)``, ``autoretry_for``'s back-off) by the clock of the
  worker that asks for it, and the worker that receives it waits for it by its own:
  two clocks apart by two minutes would start the retry two minutes early (or
  late). So a worker that publishes a message of beat's run with an ETA also puts
  the due instant by the database's clock in it (``DUE_HEADER``: the ETA less how
  far its clock reads ahead of PostgreSQL's at least, ``before_task_publish``), and
  the receiving worker's consumer step moves the ``eta`` onto its own clock from
  that instant (plus how far its clock reads ahead at most), as it moves
  ``expires``: the retry never starts before it is due by the database's clock. A
  plain retry's message received for its countdown records that instant
  (``retry_due_at``), so that if the worker holding it dies the leader sends it
  again at that time, not before. A message without the instant (the sender could
  not reach PostgreSQL, or does not run this package) waits for its ETA as Celery
  wrote it.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from celery import bootsteps, current_app
from celery._state import get_current_task

from beat.config import BeatConfig, uses_this_scheduler
from beat.delivery.app_config import delivery_config
from beat.delivery.heartbeat import _leases_of
from beat.delivery.message_times import DUE_HEADER, EXPIRES_HEADER, _instant, retry_due, run_expiry
from beat.delivery.plain_runs import RECEIPT_KEY
from beat.errors import HABeatError
from beat.models import RunState
from beat.process_locks import ForkSafeLock
from beat.publish.messages import ATTEMPT_HEADER
from beat.store.run_guard import expiry_reason
from beat.store.runs import RunStore, run_id_for, run_store_for

logger = logging.getLogger(__name__)

#: Seconds Celery's own expiry check is put after the database's (besides the
#: uncertainty of the measured offset): our checks, by the database's clock, decide.
EXPIRY_MARGIN = 1.0
#: Seconds a measured clock offset is used before it is measured again.
CLOCK_MAX_AGE = 30.0


class WorkerClock:
    """How far this process's wall clock reads ahead of PostgreSQL's, measured from a
    query: the server's ``clock_timestamp()`` against the midpoint of the local clock
    read just before and just after the round trip (wrong by at most half of it)."""

    def __init__(self, store: RunStore) -> None:
        self.store = store
        #: (at least, at most) seconds ahead, as last measured.
        self._bounds: tuple[float, float] | None = None
        self._measured = -CLOCK_MAX_AGE
        self._lock = threading.Lock()

    def ahead(self) -> float | None:
        """Seconds this clock reads ahead of the database's at most (negative: behind),
        measured again when older than ``CLOCK_MAX_AGE``; None if it never could be.
        An instant of the database's plus this is never early on this clock."""
        bounds = self._fresh_bounds()
        return None if bounds is None else bounds[1]

    def ahead_at_least(self) -> float | None:
        """Seconds this clock reads ahead of the database's at least (as ``ahead``). An
        instant of this clock less this is never early on the database's."""
        bounds = self._fresh_bounds()
        return None if bounds is None else bounds[0]

    def _fresh_bounds(self) -> tuple[float, float] | None:
        with self._lock:
            if time.monotonic() - self._measured >= CLOCK_MAX_AGE:
                self._measure()
            return self._bounds

    def _measure(self) -> None:
        try:
            before = time.time()
            server = self.store.database_now().timestamp()
            after = time.time()
        except HABeatError as exc:
            logger.warning("could not measure this worker's clock against PostgreSQL: %s", exc)
            return
        midpoint, half_trip = (before + after) / 2 - server, (after - before) / 2
        self._bounds = (midpoint - half_trip, midpoint + half_trip)
        self._measured = time.monotonic()


_clocks: dict[tuple[int, str], WorkerClock] = {}
_clocks_lock = ForkSafeLock()


def _clock_of(config: BeatConfig) -> WorkerClock:
    key = (os.getpid(), config.database_url)
    with _clocks_lock:
        clock = _clocks.get(key)
        if clock is None:
            clock = _clocks[key] = WorkerClock(run_store_for(config.database_url))
        return clock


def retime(headers: dict[str, Any], clock: WorkerClock) -> None:
    """Move the times of a message beat published onto this worker's clock, for
    Celery's own checks: its ``expires`` (the instant itself stays in
    ``EXPIRES_HEADER``) and the ``eta`` of a retry (from the instant in ``DUE_HEADER``,
    which then names the new ``eta``; a retry sent by a worker without this package
    carries no instant, and its ``eta`` is taken for one: that worker's clock is
    assumed the database's, the one assumption that keeps a worker in step from
    starting it early)."""
    if headers.get(ATTEMPT_HEADER) is None:
        return
    instant, due = run_expiry(headers), retry_due(headers) or _instant(headers.get("eta"))
    if instant is None and due is None:
        return
    ahead = clock.ahead()
    if ahead is None:  # Celery checks them as they are; a discard is settled by the database
        return
    if instant is not None:
        headers[EXPIRES_HEADER] = instant.isoformat()
        headers["expires"] = (instant + timedelta(seconds=ahead + EXPIRY_MARGIN)).isoformat()
    if due is not None:
        headers["eta"] = (due + timedelta(seconds=ahead)).isoformat()
        headers[DUE_HEADER] = {"eta": headers["eta"], "due": due.isoformat()}


def carry_database_instants(headers: dict[str, Any], clock: WorkerClock) -> None:
    """A message of beat's run that this worker sends (a retry) carries its times as
    instants of the database's clock, undoing what ``retime`` did to the message it
    retries: its ``expires`` (Celery copies the request's, moved onto this worker's
    clock) and, with an ``eta`` (written by this worker's clock), its due instant, in
    ``DUE_HEADER`` for the worker that receives it (``retime``) and as the ``eta``
    itself. A worker without this package, which cannot retime them, then reads them
    by its own clock as if it were the database's, not this worker's. Without a
    measure of this clock the ``eta`` carries no instant, and is waited for as
    written."""
    if headers.get(ATTEMPT_HEADER) is None:
        return
    instant = run_expiry(headers)
    if instant is not None:
        headers["expires"] = instant.isoformat()
    headers.pop(DUE_HEADER, None)  # an earlier retry's, copied with the parent's headers
    eta = _instant(headers.get("eta"))
    if eta is None:
        return
    least = clock.ahead_at_least()
    if least is not None:
        due = (eta - timedelta(seconds=least)).isoformat()
        headers["eta"] = due
        headers[DUE_HEADER] = {"eta": due, "due": due}


def _due_on_the_database_clock(headers: Any = None, **_: Any) -> None:
    """``before_task_publish``, in whatever process publishes (a pool process retrying)."""
    if not isinstance(headers, dict) or headers.get(ATTEMPT_HEADER) is None:
        return
    if get_current_task() is None:
        return  # beat's own publishes (beat.publish.messages.OWN_RECEIVERS): only a task's retry
    app = current_app._get_current_object()
    if uses_this_scheduler(app.conf):
        carry_database_instants(headers, _clock_of(delivery_config(app.conf)))


class TimesOnTheDatabaseClock(bootsteps.StartStopStep):  # type: ignore[misc]
    """Consumer bootstep: each message's ``expires`` and ``eta`` are moved onto this
    worker's clock before Celery reads them (see the module docstring)."""

    label = "times on the database's clock"
    requires = ("celery.worker.consumer.tasks:Tasks",)

    def __init__(self, c: Any, **kwargs: Any) -> None:
        super().__init__(c, **kwargs)
        clock = _clock_of(BeatConfig.from_celery_conf(c.app.conf))
        create = c.create_task_handler

        def create_task_handler() -> Callable[[Any], Any]:
            on_task_received = create()

            def retimed(message: Any) -> Any:
                if isinstance(message.headers, dict):
                    retime(message.headers, clock)
                return on_task_received(message)

            return retimed

        c.create_task_handler = create_task_handler


def _add_consumer_step(sender: Any = None, **_: Any) -> None:
    app = getattr(sender, "app", None)
    if app is not None and uses_this_scheduler(app.conf):
        app.steps["consumer"].add(TimesOnTheDatabaseClock)


def _record_expiry(
    sender: Any = None, request: Any = None, expired: bool = False, **_: Any
) -> None:
    """Celery discarded a delivery because its ``expires`` passed by this worker's clock:
    the database's clock decides what becomes of the run (see the module docstring)."""
    if not expired or request is None or sender is None or request.id is None:
        return
    fields = vars(request)
    expires = run_expiry(fields)
    if expires is None:
        return
    leases = _leases_of(delivery_config(sender.app.conf), request.hostname or "worker")
    run_id = run_id_for(request.id)
    try:
        state = leases.store.end_discarded(
            run_id, expires=expires, owner=leases.owner, attempt=fields.get(RECEIPT_KEY)
        )
    except HABeatError as exc:
        logger.error("could not settle the discarded delivery of run %s: %s", run_id, exc)
        return
    extra = {"run_id": str(run_id)}
    if state == RunState.EXPIRED.value:
        logger.warning("run %s %s", run_id, expiry_reason(expires), extra=extra)
    elif state == RunState.PENDING.value:
        from celery.worker import state as worker_state

        worker_state.revoked.discard(request.id)  # this worker takes its next delivery
        logger.warning(
            "Celery discarded run %s as expired by this worker's clock, but by the"
            " database's it expires at %s: sent again",
            run_id,
            expires.isoformat(),
            extra=extra,
        )
