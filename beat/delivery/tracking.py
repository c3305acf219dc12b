"""What workers do with beat's runs, recorded from Celery's own signals.

Installed in a worker by importing this module (the app's ``imports`` setting
lists it); no task has to change. It covers what the idempotent base
(``beat.delivery.task.IdempotentTask``) cannot see from inside a task:

- **Receipt**: when the message of a run beat published reaches a worker
  (``task_received``, in its main process), the run is held under a receipt
  lease that the worker renews while the request is in its hands (reserved,
  waiting for a retry's countdown, or running). If the worker dies before the
  run starts, the lease expires and the leader publishes the run again at
  once, rather than after the broker's visibility timeout.
- **Plain tasks** (not on the idempotent base): the receipt also takes the
  run (``running``); the pool records when the body starts and how it ended
  (``task_prerun``/``task_postrun``). Once a worker took a plain run, the run
  is never started again: a second delivery (a broker redelivery, a copy the
  leader sent because it could not find the message) is dropped at receipt.
  If the worker dies while it holds the run, the leader's reaper ends the run
  ``lost`` rather than send it again: a plain task may have had its effect. So
  does a body Celery terminates (the prefork pool's SIGTERM: a request cancelled
  on a lost broker connection, ``worker_cancel_long_running_tasks_on_connection_loss``,
  or revoked with ``terminate``): its trace unwinds with no outcome, and the run
  ends ``lost`` with the reason, not ``failed``; a body that returned first keeps
  its outcome. The threads pool cannot terminate a body: it runs to its end.
- **A plain run starts only while its delivery holds it**: the receipt numbers
  the attempt it took; the pool process starts the body only if that attempt,
  under this worker's receipt, still holds the run (``RunStore.start_plain``, one
  conditional statement, run where the pool executes the request, just before
  Celery's trace). A worker paused past its receipt lease (SIGSTOP, a VM pause, a
  long GC) may find that the leader sent the run to another worker meanwhile:
  its reserved copy is then acknowledged and never run, as a duplicate delivery
  is at receipt. The pool is handed the request through a wrapper of the
  request's ``execute_using_pool`` (as a duplicate is dropped at receipt), since
  Celery's ``task_prerun`` cannot keep a body from running.
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

Only runs beat published are recorded (their messages carry beat's headers);
other tasks are left to Celery.
"""

from __future__ import annotations

import inspect
import logging
import os
import threading
import time
import uuid
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from billiard.einfo import ExceptionInfo  # type: ignore[import-untyped]
from celery import Task as CeleryTask
from celery import bootsteps, current_app
from celery._state import get_current_task
from celery.app.trace import fast_trace_task, trace_task_ret
from celery.exceptions import Ignore, Reject, Retry, TaskRevokedError
from celery.signals import (
    before_task_publish,
    task_postrun,
    task_received,
    task_retry,
    task_revoked,
    worker_init,
    worker_ready,
)

from beat import metrics
from beat.config import BeatConfig, uses_this_scheduler
from beat.errors import HABeatError
from beat.lease.beacon import process_session
from beat.models import RunState
from beat.publish.dispatch import published_by_beat
from beat.publish.messages import ATTEMPT_HEADER, RETRY_INSTANTS_RECEIVER
from beat.records import Session
from beat.store.plain_runs import (
    CANCELLED_ON_CONNECTION_LOSS,
    PLAIN_RUN_TERMINATED,
    TAKEN_UNRECORDED,
)
from beat.store.run_guard import Refused, Started, expiry_reason
from beat.store.runs import RunStore, run_id_for, run_store_for

logger = logging.getLogger(__name__)

#: Seconds a worker that cannot reach PostgreSQL waits before handing a plain run's
#: message back (so it does not spin on it while cut off).
REQUEUE_DELAY = 1.0
#: Seconds between two tries of a plain run's record while PostgreSQL is unreachable,
#: and how long it is tried: a plain run is never run again, so its record must last
#: through a PostgreSQL restart.
PERSIST_RETRY_DELAY = 0.5
PERSIST_FOR = 60.0
#: Longest error text recorded on a run.
MAX_ERROR_LENGTH = 4000
#: A plain run taken this recently is renewed even before Celery lists its request
#: (the request is reserved just after ``task_received``).
RECEIPT_GRACE = 5.0

#: The header that keeps a run's expiry instant (the database's clock) once ``expires``
#: is moved onto a worker's clock for Celery's own check.
EXPIRES_HEADER = "habeat_expires"
#: The header that carries a message's due instant by the database's clock, with the
#: ``eta`` it stands for (a retry copies its parent's headers: an instant whose ``eta``
#: is not the message's is an earlier one's).
DUE_HEADER = "habeat_due"
#: The key of a request's headers that holds the attempt its receipt took (plain runs).
RECEIPT_KEY = "habeat_receipt_attempt"
#: Seconds Celery's own expiry check is put after the database's (besides the
#: uncertainty of the measured offset): our checks, by the database's clock, decide.
EXPIRY_MARGIN = 1.0
#: Seconds a measured clock offset is used before it is measured again.
CLOCK_MAX_AGE = 30.0

#: Celery's outcome of a task (``task_postrun``'s ``state``) → the run's state.
_OUTCOMES = {
    "SUCCESS": RunState.SUCCEEDED,
    "FAILURE": RunState.FAILED,
    "RETRY": RunState.RETRYING,
    "IGNORED": RunState.CANCELLED,
    "REJECTED": RunState.FAILED,
}


def is_guarded(task: Any) -> bool:
    """Does the task guard its own runs (the idempotent base)?"""
    return bool(getattr(task, "habeat_guarded", False))


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


def error_text(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}"
    return text if len(text) <= MAX_ERROR_LENGTH else text[: MAX_ERROR_LENGTH - 1] + "…"


class WorkerHeartbeat:
    """The worker's main process, seen from PostgreSQL: its presence (``beat_workers``)
    and the receipt leases of the runs whose message it took, renewed while their
    requests live.

    A request that finished, or whose pool process died, leaves Celery's lists of
    requests: its lease is then no longer renewed and expires, and the reaper acts
    (a run not started is published again; a plain run that started ends ``lost``).
    A worker that died stops being seen: the reaper then knows that the runs it held
    were interrupted, not that they crashed it."""

    def __init__(
        self,
        store: RunStore,
        hostname: str,
        lease_seconds: float,
        beacon: Callable[[], Session | None] = lambda: None,
    ) -> None:
        self.store = store
        #: This process's beacon (``beat.lease.beacon``), recorded with its presence: asked
        #: at every heartbeat, it opens again a half it lost.
        self.beacon = beacon
        self.hostname = hostname
        self.owner = f"{hostname}:{os.getpid()}:received"
        self.lease_seconds = lease_seconds
        self._started = time.monotonic()
        #: When this process started, by the database's clock (read at its first renewal).
        self.booted_at: datetime | None = None
        self._taken: dict[uuid.UUID, tuple[str, float]] = {}
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._beat, name="habeat-worker-heartbeat", daemon=True
                )
                self._thread.start()

    def add(self, run_id: uuid.UUID, task_id: str) -> None:
        with self._lock:
            self._taken[run_id] = (task_id, time.monotonic())
        self.start()

    def _beat(self) -> None:
        while True:
            self.renew()
            time.sleep(self.lease_seconds / 3)

    def renew(self) -> None:
        """Renew the receipt leases of the runs still in hand, and this worker's presence."""
        held = self._still_held()
        try:
            # The leases first: opening a lost half of the beacon again may take time.
            self.store.heartbeat_received(self.owner, held, lease_seconds=self.lease_seconds)
            self.store.worker_seen(
                self.hostname,
                pid=os.getpid(),
                booted_at=self._boot_time(),
                session=self.beacon(),
            )
        except HABeatError as exc:
            logger.warning("could not renew this worker's leases (%d runs): %s", len(held), exc)

    def _boot_time(self) -> datetime:
        """When this process started, by the database's clock: PostgreSQL's time less
        the monotonic seconds since, read once and kept, so every renewal of this
        process records the same instant. The reaper compares it with the start of a run
        (``_worker_died`` in ``beat.store.leader.reaper``) to tell a restarted worker from the
        same one: a wall clock set wrong would make either read as the other. The time
        the query takes counts as elapsed: the instant is early by at most that."""
        if self.booted_at is None:
            database_now = self.store.database_now()
            elapsed = time.monotonic() - self._started
            self.booted_at = database_now - timedelta(seconds=elapsed)
        return self.booted_at

    def _still_held(self) -> list[uuid.UUID]:
        from celery.worker import state

        live = set(state.requests) | {request.id for request in list(state.scheduled_requests)}
        now = time.monotonic()
        with self._lock:
            for run_id, (task_id, taken) in list(self._taken.items()):
                if task_id not in live and now - taken > RECEIPT_GRACE:
                    del self._taken[run_id]
            return list(self._taken)


_leases: dict[int, WorkerHeartbeat] = {}
_leases_lock = threading.Lock()


def _leases_of(config: BeatConfig, hostname: str) -> WorkerHeartbeat:
    with _leases_lock:
        leases = _leases.get(os.getpid())
        if leases is None:
            leases = _leases[os.getpid()] = WorkerHeartbeat(
                run_store_for(config.database_url),
                hostname,
                config.lease_timeout,
                beacon=lambda: process_session(config),
            )
        return leases


def _worker_ready(sender: Any = None, **_: Any) -> None:
    """Start being seen as soon as the worker consumes (its main process)."""
    hostname = getattr(sender, "hostname", None)
    app = getattr(sender, "app", None)
    if not hostname or app is None or not uses_this_scheduler(app.conf):
        return
    _leases_of(BeatConfig.from_celery_conf(app.conf), hostname).start()


# -- Celery's expiry check, moved onto the database's clock (the worker's main process) ----


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


def _clock_of(config: BeatConfig) -> WorkerClock:
    key = (os.getpid(), config.database_url)
    with _leases_lock:
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
        carry_database_instants(headers, _clock_of(BeatConfig.from_celery_conf(app.conf)))


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


# -- receipt (the worker's main process) ------------------------------------------------


def _redelivered(request: Any) -> bool:
    """Whether the broker hands this message out again after a consumer took it (kombu
    marks a delivery it restored from its unacknowledged ones)."""
    delivery_info = getattr(request, "delivery_info", None) or {}
    return bool(delivery_info.get("redelivered"))


def _hold_received_run(sender: Any = None, request: Any = None, **_: Any) -> None:
    """Hold the run of a message beat published when it arrives; for a plain task, take
    the run, or drop the delivery if the run was taken before."""
    if request is None:
        return
    context = request.request_dict
    if not published_by_beat(_Headers(context)):
        return
    context.pop(RECEIPT_KEY, None)  # a retry carries its parent's headers
    config = BeatConfig.from_celery_conf(request.task.app.conf)
    leases = _leases_of(config, request.hostname or "worker")
    run_id = run_id_for(request.id)
    expires = run_expiry(context)
    due = retry_due(context)
    try:
        if is_guarded(request.task):
            if expires is not None and leases.store.expire_if_past(run_id, expires):
                _expired_at_receipt(request, run_id, expires)
                return
            # The guard decides in the pool whether this delivery runs; until then the
            # worker only holds the run.
            if leases.store.note_received(
                run_id,
                owner=leases.owner,
                worker=request.hostname or "",
                lease_seconds=config.lease_timeout,
            ):
                leases.add(run_id, request.id)
            return
        if _redelivered(request) and leases.store.end_taken_unrecorded(
            run_id, queue=str(request.delivery_info.get("routing_key") or "")
        ):
            logger.error(
                "plain run %s is lost: %s",
                run_id,
                TAKEN_UNRECORDED,
                extra={"run_id": str(run_id)},
            )
            _drop(request, requeue=False)
            return
        outcome = leases.store.receive_plain(
            run_id,
            owner=leases.owner,
            worker=request.hostname or "",
            lease_seconds=config.lease_timeout,
            retries=int(context.get("retries") or 0),
            expires=expires,
            retry_due_at=due,
            # Without the instant, the ETA as this worker's clock reads it.
            retry_due_in=seconds_until(request.eta) if request.eta and due is None else None,
        )
    except HABeatError as exc:
        if is_guarded(request.task):
            logger.warning("could not record the receipt of run %s: %s", run_id, exc)
            return
        logger.error(
            "cannot check plain run %s against the run table, handing it back: %s",
            run_id,
            exc,
            extra={"run_id": str(run_id)},
        )
        metrics.WORKER_REQUEUED.inc()
        time.sleep(REQUEUE_DELAY)
        _drop(request, requeue=True)
        return
    if isinstance(outcome, Refused) and outcome.state == RunState.EXPIRED.value:
        _expired_at_receipt(request, run_id, expires)
        return
    if isinstance(outcome, Refused):
        metrics.WORKER_DUPLICATE_DELIVERIES.inc()
        logger.warning(
            "dropped a delivery of plain run %s (%s): it is %s; a plain task runs at most once"
            " once a worker took it",
            run_id,
            request.name,
            outcome.state,
            extra={"run_id": str(run_id), "state": outcome.state},
        )
        _drop(request, requeue=False)
        return
    leases.add(run_id, request.id)
    _start_only_while_held(
        request,
        PlainStart(
            run_id=run_id,
            owner=leases.owner,
            attempt=outcome.attempt,
            database_url=config.database_url,
            expires=expires,
        ),
    )


def _expired_at_receipt(request: Any, run_id: uuid.UUID, expires: datetime | None) -> None:
    logger.warning(
        "run %s (%s) expired at %s (the database's clock) before a worker started it: not run",
        run_id,
        request.name,
        expires.isoformat() if expires else "?",
        extra={"run_id": str(run_id)},
    )
    _drop(request, requeue=False)


class _Headers:
    """A request's message headers seen as attributes, like a task's request."""

    def __init__(self, headers: dict[str, Any]) -> None:
        self.__dict__.update(headers)


def _drop(request: Any, *, requeue: bool) -> None:
    """Make Celery skip this request: its message is acknowledged (or handed back)
    and the pool never sees it."""
    from celery.worker import state

    def skip(pool: Any, **_: Any) -> None:
        state.task_ready(request)
        if requeue:
            request.reject(requeue=True)
        else:
            request.acknowledge()
        raise TaskRevokedError(request.id)  # the consumer releases the request's slot

    request.execute_using_pool = skip


# -- execution (the pool process) ---------------------------------------------------------

_running_plain: dict[str, uuid.UUID] = {}


@dataclass(frozen=True, slots=True, kw_only=True)
class PlainStart:
    """The delivery that took a plain run at receipt: the pool starts the body only while
    it still holds the run."""

    run_id: uuid.UUID
    owner: str
    attempt: int
    database_url: str
    expires: datetime | None


def _start_only_while_held(request: Any, start: PlainStart) -> None:
    """Hand this request to the pool behind ``_start_then_trace``.

    What Celery's ``Request.execute_using_pool`` does, with the gate put before its
    trace (the request class Celery builds per task binds the pool's ``apply_async``
    and the trace function when it is made, so neither can be wrapped from outside)."""

    def execute_using_pool(pool: Any, **_: Any) -> Any:
        if request.revoked():
            raise TaskRevokedError(request.id)
        task = request.task
        time_limit, soft_time_limit = request.time_limits
        trace = fast_trace_task if request.app.use_fast_trace_task else trace_task_ret
        result = pool.apply_async(
            _start_then_trace,
            args=(
                start,
                trace,
                request.type,
                request.id,
                request.request_dict,
                request.body,
                request.content_type,
                request.content_encoding,
            ),
            accept_callback=request.on_accepted,
            timeout_callback=request.on_timeout,
            callback=request.on_success,
            error_callback=request.on_failure,
            soft_timeout=soft_time_limit or task.soft_time_limit,
            timeout=time_limit or task.time_limit,
            correlation_id=request.id,
        )
        request._apply_result = None if result is None else weakref.ref(result)
        return result

    request.execute_using_pool = execute_using_pool
    # What a discard of this delivery settles (Celery reports it with a context made
    # from the request's headers).
    request.request_dict[RECEIPT_KEY] = start.attempt


def _start_then_trace(start: PlainStart, trace: Callable[..., Any], *args: Any) -> Any:
    """In the pool: record the start of the plain run and run Celery's trace of it, if
    this delivery still holds the run and it has not expired; else run nothing."""
    store = run_store_for(start.database_url)
    outcomes: list[Started | Refused] = []
    started = _persist(
        lambda: outcomes.append(
            store.start_plain(
                start.run_id, owner=start.owner, attempt=start.attempt, expires=start.expires
            )
        )
    )
    outcome = outcomes[0] if started else None
    if isinstance(outcome, Started):
        # Recorded before the body runs: a run whose worker dies after this is never
        # sent again; before it, it is.
        _running_plain[args[1]] = start.run_id
        _note_unsent_retries(args[0])
        return trace(*args)
    _log_not_started(start, outcome)
    return _not_run()


#: Task ID → when the retry it asked for is due (``time.monotonic()``), for a retry
#: Celery could not publish (``_note_unsent_retries``).
_unsent_retries: dict[str, float] = {}


def _note_unsent_retries(name: str) -> None:
    """Note the retries of the task ``name`` that Celery cannot publish
    (``note_unsent_retries``); never in the way of the run, which has started."""
    try:
        note_unsent_retries(current_app.tasks.get(name))
    except Exception as exc:
        logger.warning("cannot note the unsent retries of %s: %s", name, exc)


def note_unsent_retries(task: Any) -> None:
    """Note the retries of ``task`` that Celery cannot publish.

    ``Task.retry`` raises ``Reject`` (not requeued) when it cannot publish the retry,
    the broker being down: the retry was asked for and never sent, and Celery records
    neither it nor its countdown. Wrapped on the task instance (once, at its first run
    of beat's), ``retry`` keeps the due time of such a retry, so that the run is
    recorded ``retrying`` (``_plain_outcome``) and the leader sends its message again
    once it is due, instead of ending ``failed``: a retry lost to a broker outage.

    Only a retry the leader can send as Celery would have is kept: one of Celery's own
    ``Task.retry`` (an override may compute its countdown out of sight) that asks for
    no other arguments or options than the run's (the leader sends the run's own);
    any other ends ``failed``, as before."""
    if task is None or getattr(task.retry, "habeat_notes_unsent", False):
        return
    if getattr(type(task), "retry", None) is not CeleryTask.retry:
        return
    ask = task.retry

    def retry(*args: Any, **kwargs: Any) -> Any:
        # Read before the publish, which may take a while to fail.
        due = _unsent_retry_due(task, _RETRY_PARAMETERS.bind_partial(task, *args, **kwargs))
        try:
            return ask(*args, **kwargs)
        except Reject:  # only its publish raises this: the retry was not sent
            if due is not None:
                _unsent_retries[task.request.id] = due
            raise

    retry.habeat_notes_unsent = True  # type: ignore[attr-defined]
    task.retry = retry


_RETRY_PARAMETERS = inspect.signature(CeleryTask.retry)


def _unsent_retry_due(task: Any, asked: inspect.BoundArguments) -> float | None:
    """When a retry asked with ``asked`` is due (``time.monotonic()``), as Celery
    reads its countdown and ETA; None if it asks for other arguments or options than
    the run's, which the leader could not send."""
    given = asked.arguments
    if given.get("args") is not None or given.get("kwargs") is not None or given.get("options"):
        return None
    countdown, eta = given.get("countdown"), given.get("eta")
    if not eta and countdown is None:
        countdown = task.default_retry_delay
    # Celery's message takes its ETA from a countdown if there is one (amqp.as_task_v2).
    return time.monotonic() + seconds_until(countdown if countdown else (eta or 0))


def _log_not_started(start: PlainStart, outcome: Refused | None) -> None:
    extra = {"run_id": str(start.run_id)}
    if outcome is None:
        logger.error(
            "could not record the start of plain run %s: not run (its receipt lease ends"
            " and the leader sends it again)",
            start.run_id,
            extra=extra,
        )
    elif outcome.state == RunState.EXPIRED.value:
        logger.warning(
            "plain run %s expired at %s (the database's clock) before it started: not run",
            start.run_id,
            start.expires.isoformat() if start.expires else "?",
            extra=extra,
        )
    else:
        metrics.WORKER_DUPLICATE_DELIVERIES.inc()
        logger.warning(
            "did not start plain run %s: this delivery no longer holds it (it is %s%s);"
            " a plain task runs at most once",
            start.run_id,
            outcome.state,
            f" under the lease of {outcome.lease_owner}" if outcome.lease_owner else "",
            extra=extra,
        )


def _not_run() -> tuple[int, Any, float]:
    """What the pool hands back for a request whose body did not run: what Celery's
    trace gives for a task that raised ``Ignore`` (the message is acknowledged, no
    result is recorded)."""
    try:
        raise Ignore("not started: see the log line before")
    except Ignore:
        return 1, ExceptionInfo(internal=True), 0.0


def _plain_run_ended(
    sender: Any = None,
    task_id: str | None = None,
    task: Any = None,
    retval: Any = None,
    state: str | None = None,
    **_: Any,
) -> None:
    run_id = _running_plain.pop(task_id or "", None)
    unsent_retry_due = _unsent_retries.pop(task_id or "", None)
    if run_id is None or task is None:
        return
    outcome, error = _plain_outcome(state, retval, unsent_retry=unsent_retry_due is not None)
    retry_due = (
        time.monotonic() + retry_delay(retval) if isinstance(retval, Retry) else unsent_retry_due
    )
    store = _store_of(task)
    attempt_retries = task.request.retries or 0

    def finish() -> None:
        store.finish_plain(
            run_id,
            state=outcome,
            error=None if outcome is RunState.SUCCEEDED else error,
            attempt_retries=attempt_retries,
            # What is left of the countdown when the write lands (PostgreSQL may have
            # been down for a while): the retry's message waits for the countdown
            # from when it was asked, and the recorded due time must not be later.
            retry_in=None if retry_due is None else retry_due - time.monotonic(),
        )

    # A plain run is never run again: its outcome must reach PostgreSQL, also through
    # a restart of it.
    if not _persist(finish):
        logger.error(
            "could not record plain run %s as %s",
            run_id,
            outcome.value,
            extra={"run_id": str(run_id)},
        )


def _plain_outcome(
    state: str | None, retval: Any, *, unsent_retry: bool = False
) -> tuple[RunState, str | None]:
    """The run's state and error for Celery's outcome of a plain body (``task_postrun``).
    No state: the trace was unwound before the body returned, by a ``BaseException``
    (the SIGTERM Celery sends a prefork pool process to terminate a request, cancelled on
    a lost broker connection or revoked): the body may have had its effect and is never
    run again, so the run is ``lost``, not ``failed`` with no error. Rejected after the
    body asked for a retry Celery could not publish (``unsent_retry``): the run is
    ``retrying``, and the leader sends the retry when it is due (its message is not in
    the broker: lost-message recovery)."""
    if state is None:
        return RunState.LOST, PLAIN_RUN_TERMINATED
    if unsent_retry and state == "REJECTED" and isinstance(retval, Reject):
        return RunState.RETRYING, error_text(retval)
    error = error_text(retval) if isinstance(retval, BaseException) else None
    return _OUTCOMES.get(state, RunState.FAILED), error


def _plain_run_cancelled(
    sender: Any = None, request: Any = None, einfo: Any = None, **_: Any
) -> None:
    """Celery cancelled a request on a lost broker connection (``Request.cancel``: its
    ``_announce_cancelled`` sends ``task_retry`` with no ``einfo``, in the main process,
    right after it sent SIGTERM to the pool process running it): a plain run of beat's
    whose body started ends ``lost`` with the reason (``RunStore.cancel_plain``). On the
    threads pool Celery cannot terminate a body, announces nothing, and the body's own
    outcome is recorded when it returns."""
    if einfo is not None or request is None or sender is None or is_guarded(sender):
        return
    if not published_by_beat(request) or request.id is None:
        return
    run_id = run_id_for(request.id)
    retries = int(getattr(request, "retries", 0) or 0)
    try:
        # Tried once: this is the consumer's thread, reconnecting. If it fails, the pool
        # process's record (the body did not return) or the reaper ends the run lost.
        cancelled = _store_of(sender).cancel_plain(run_id, attempt_retries=retries)
    except HABeatError as exc:
        logger.warning("could not record the cancel of plain run %s: %s", run_id, exc)
        return
    if cancelled:
        logger.warning(
            "plain run %s: %s", run_id, CANCELLED_ON_CONNECTION_LOSS, extra={"run_id": str(run_id)}
        )


def _persist(write: Callable[[], None]) -> bool:
    """Do ``write``, trying again while PostgreSQL is unreachable, for up to
    ``PERSIST_FOR`` seconds (a restart, crash recovery included)."""
    deadline = time.monotonic() + PERSIST_FOR
    while True:
        try:
            write()
            return True
        except HABeatError as exc:
            if time.monotonic() + PERSIST_RETRY_DELAY > deadline:
                logger.warning("gave up writing to the run table: %s", exc)
                return False
            time.sleep(PERSIST_RETRY_DELAY)


def _store_of(task: Any) -> RunStore:
    return run_store_for(BeatConfig.from_celery_conf(task.app.conf).database_url)


# -- expiry (the worker's main process) ---------------------------------------------------


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
    leases = _leases_of(BeatConfig.from_celery_conf(sender.app.conf), request.hostname or "worker")
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


def install() -> None:
    """Connect the handlers (done on import; weak references are not used, so once is enough)."""
    task_received.connect(_hold_received_run, weak=False, dispatch_uid="habeat.hold_received_run")
    task_postrun.connect(_plain_run_ended, weak=False, dispatch_uid="habeat.plain_run_ended")
    task_retry.connect(_plain_run_cancelled, weak=False, dispatch_uid="habeat.plain_run_cancelled")
    task_revoked.connect(_record_expiry, weak=False, dispatch_uid="habeat.record_expiry")
    worker_ready.connect(_worker_ready, weak=False, dispatch_uid="habeat.worker_ready")
    worker_init.connect(_add_consumer_step, weak=False, dispatch_uid="habeat.expiry_step")
    before_task_publish.connect(
        _due_on_the_database_clock, weak=False, dispatch_uid=RETRY_INSTANTS_RECEIVER
    )


install()
