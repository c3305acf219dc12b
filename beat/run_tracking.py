"""What workers do with beat's runs, recorded from Celery's own signals.

Installed in a worker by importing this module (the app's ``imports`` setting
lists it); no task has to change. It covers what the idempotent base
(``beat.task.IdempotentTask``) cannot see from inside a task:

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
  ``lost`` rather than send it again: a plain task may have had its effect.
- **Expired deliveries**: a message whose ``expires`` passed is discarded by
  Celery before any task code runs (``task_revoked`` with ``expired``); the run
  ends ``expired`` instead of waiting to be sent again.

Only runs beat published are recorded (their messages carry beat's headers);
other tasks are left to Celery.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from celery.exceptions import Retry, TaskRevokedError
from celery.signals import (
    task_postrun,
    task_prerun,
    task_received,
    task_revoked,
    worker_ready,
)

from beat import metrics
from beat.config import BeatConfig, uses_this_scheduler
from beat.dispatch import published_by_beat
from beat.errors import HABeatError
from beat.liveness import Session, process_session
from beat.models import RunState
from beat.run_store import Refused, RunStore, run_id_for, run_store_for

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
        #: This process's beacon (``beat.liveness``), recorded with its presence: asked
        #: at every heartbeat, it opens again a half it lost.
        self.beacon = beacon
        self.hostname = hostname
        self.owner = f"{hostname}:{os.getpid()}:received"
        self.lease_seconds = lease_seconds
        self.booted_at = datetime.now(UTC)
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
            held = self._still_held()
            try:
                # The leases first: opening a lost half of the beacon again may take time.
                self.store.heartbeat_received(self.owner, held, lease_seconds=self.lease_seconds)
                self.store.worker_seen(
                    self.hostname,
                    pid=os.getpid(),
                    booted_at=self.booted_at,
                    session=self.beacon(),
                )
            except HABeatError as exc:
                logger.warning("could not renew this worker's leases (%d runs): %s", len(held), exc)
            time.sleep(self.lease_seconds / 3)

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


# -- receipt (the worker's main process) ------------------------------------------------


def _hold_received_run(sender: Any = None, request: Any = None, **_: Any) -> None:
    """Hold the run of a message beat published when it arrives; for a plain task, take
    the run, or drop the delivery if the run was taken before."""
    if request is None:
        return
    context = request.request_dict
    if not published_by_beat(_Headers(context)):
        return
    config = BeatConfig.from_celery_conf(request.task.app.conf)
    leases = _leases_of(config, request.hostname or "worker")
    run_id = run_id_for(request.id)
    try:
        if is_guarded(request.task):
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
        outcome = leases.store.receive_plain(
            run_id,
            owner=leases.owner,
            worker=request.hostname or "",
            lease_seconds=config.lease_timeout,
            retries=int(context.get("retries") or 0),
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


def _plain_run_started(
    sender: Any = None, task_id: str | None = None, task: Any = None, **_: Any
) -> None:
    if task is None or task_id is None or is_guarded(task):
        return
    if not published_by_beat(task.request):
        return
    run_id = run_id_for(task_id)
    _running_plain[task_id] = run_id
    store = _store_of(task)
    # Recorded before the body runs: a run whose worker dies after this is never sent
    # again; before it, it is.
    if not _persist(lambda: store.start_plain(run_id), task):
        logger.error("could not record the start of plain run %s", run_id)


def _plain_run_ended(
    sender: Any = None,
    task_id: str | None = None,
    task: Any = None,
    retval: Any = None,
    state: str | None = None,
    **_: Any,
) -> None:
    run_id = _running_plain.pop(task_id or "", None)
    if run_id is None or task is None:
        return
    outcome = _OUTCOMES.get(state or "", RunState.FAILED)
    error = error_text(retval) if isinstance(retval, BaseException) else None
    retry_in = retry_delay(retval) if isinstance(retval, Retry) else None
    store = _store_of(task)
    attempt_retries = task.request.retries or 0

    def finish() -> None:
        store.finish_plain(
            run_id,
            state=outcome,
            error=None if outcome is RunState.SUCCEEDED else error,
            attempt_retries=attempt_retries,
            retry_in=retry_in,
        )

    # A plain run is never run again: its outcome must reach PostgreSQL, also through
    # a restart of it.
    if not _persist(finish, task):
        logger.error(
            "could not record plain run %s as %s",
            run_id,
            outcome.value,
            extra={"run_id": str(run_id)},
        )


def _persist(write: Callable[[], None], task: Any) -> bool:
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
    """A delivery Celery discarded because its ``expires`` passed ends its run."""
    if not expired or request is None or sender is None or request.id is None:
        return
    run_id = run_id_for(request.id)
    reason = f"expired at {request.expires} before a worker started it"
    try:
        recorded = _store_of(sender).record_expired(run_id, reason=reason)
    except HABeatError as exc:
        logger.error("could not record run %s as expired: %s", run_id, exc)
        return
    if recorded:
        logger.warning("run %s %s", run_id, reason, extra={"run_id": str(run_id)})


def install() -> None:
    """Connect the handlers (done on import; weak references are not used, so once is enough)."""
    task_received.connect(_hold_received_run, weak=False, dispatch_uid="habeat.hold_received_run")
    task_prerun.connect(_plain_run_started, weak=False, dispatch_uid="habeat.plain_run_started")
    task_postrun.connect(_plain_run_ended, weak=False, dispatch_uid="habeat.plain_run_ended")
    task_revoked.connect(_record_expiry, weak=False, dispatch_uid="habeat.record_expiry")
    worker_ready.connect(_worker_ready, weak=False, dispatch_uid="habeat.worker_ready")


install()
