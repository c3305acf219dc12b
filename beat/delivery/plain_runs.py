"""Plain tasks' runs: the start of their bodies in the pool process and the
outcomes they end with.

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
- **A request that runs at once is taken by its start**: no ETA, no countdown, not
  a redelivery, a free pool slot: the pool process takes the run and starts it in one
  statement (``RunStore.take_and_start_plain``), just before Celery's trace, instead
  of a receipt in the main process and a start in the pool (one round trip a run
  less). A duplicate is refused there as it would be at receipt.
- **A plain run taken at receipt starts only while its delivery holds it**: the
  receipt numbers the attempt it took; the pool process starts the body only if that attempt,
  under this worker's receipt, still holds the run (``RunStore.start_plain``, one
  conditional statement, run where the pool executes the request, just before
  Celery's trace). A worker paused past its receipt lease (SIGSTOP, a VM pause, a
  long GC) may find that the leader sent the run to another worker meanwhile:
  its reserved copy is then acknowledged and never run, as a duplicate delivery
  is at receipt. The pool is handed the request through a wrapper of the
  request's ``execute_using_pool`` (as a duplicate is dropped at receipt), since
  Celery's ``task_prerun`` cannot keep a body from running.
"""

from __future__ import annotations

import logging
import time
import uuid
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from billiard.einfo import ExceptionInfo  # type: ignore[import-untyped]
from celery.app.trace import fast_trace_task, trace_task_ret
from celery.exceptions import Ignore, Reject, Retry, TaskRevokedError

from beat import metrics
from beat.delivery.app_config import delivery_config
from beat.delivery.message_times import retry_delay
from beat.delivery.unsent_retries import _note_unsent_retries, _unsent_retries
from beat.errors import HABeatError
from beat.models import RunState
from beat.publish.dispatch import published_by_beat
from beat.store.plain_runs import CANCELLED_ON_CONNECTION_LOSS, PLAIN_RUN_TERMINATED
from beat.store.run_guard import Refused, Started
from beat.store.runs import RunStore, run_id_for, run_store_for

logger = logging.getLogger(__name__)

#: Seconds between two tries of a plain run's record while PostgreSQL is unreachable,
#: and how long it is tried: a plain run is never run again, so its record must last
#: through a PostgreSQL restart.
PERSIST_RETRY_DELAY = 0.5
PERSIST_FOR = 60.0
#: Longest error text recorded on a run.
MAX_ERROR_LENGTH = 4000
#: The key of a request's headers that holds the attempt its receipt took (plain runs).
RECEIPT_KEY = "habeat_receipt_attempt"
#: Seconds a worker that cannot reach PostgreSQL waits before handing a plain run's
#: message back (so it does not spin on it while cut off).
REQUEUE_DELAY = 1.0

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


def recorded_error(exc: BaseException) -> str:
    """An exception as its run records it: its type and whole message, cut at
    ``MAX_ERROR_LENGTH`` (``beat.errors.error_text`` is the one line shown to people)."""
    text = f"{type(exc).__name__}: {exc}"
    return text if len(text) <= MAX_ERROR_LENGTH else text[: MAX_ERROR_LENGTH - 1] + "…"


_running_plain: dict[str, uuid.UUID] = {}


@dataclass(frozen=True, slots=True, kw_only=True)
class PlainStart:
    """The delivery of a plain run, as the pool process starts it: taken at receipt
    (``attempt``: the body starts only while it still holds the run), or to be taken
    and started at once (``attempt`` None)."""

    run_id: uuid.UUID
    owner: str
    attempt: int | None
    database_url: str
    expires: datetime | None
    worker: str = ""
    lease_seconds: float = 0.0
    retries: int = 0


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
    if start.attempt is not None:
        # What a discard of this delivery settles (Celery reports it with a context made
        # from the request's headers).
        request.request_dict[RECEIPT_KEY] = start.attempt


def _start_then_trace(start: PlainStart, trace: Callable[..., Any], *args: Any) -> Any:
    """In the pool: record the start of the plain run and run Celery's trace of it, if
    this delivery still holds the run (or, not taken yet, may take it) and it has not
    expired; else run nothing."""
    store = run_store_for(start.database_url)
    if start.attempt is None:
        try:
            outcome: Started | Refused | None = _take_and_start(store, start)
        except HABeatError as exc:
            return _handed_back(start, exc)
    else:
        outcome = _recorded_start(store, start, start.attempt)
    if isinstance(outcome, Started):
        # Recorded before the body runs: a run whose worker dies after this is never
        # sent again; before it, it is.
        _running_plain[args[1]] = start.run_id
        _note_unsent_retries(args[0])
        return trace(*args)
    _log_not_started(start, outcome)
    return _not_run()


def _take_and_start(store: RunStore, start: PlainStart) -> Started | Refused:
    return store.take_and_start_plain(
        start.run_id,
        owner=start.owner,
        worker=start.worker,
        lease_seconds=start.lease_seconds,
        retries=start.retries,
        expires=start.expires,
    )


def _recorded_start(store: RunStore, start: PlainStart, attempt: int) -> Started | Refused | None:
    """The start of a run taken at receipt, tried through a PostgreSQL restart: None if
    it could not be recorded."""
    outcomes: list[Started | Refused] = []
    started = _persist(
        lambda: outcomes.append(
            store.start_plain(
                start.run_id, owner=start.owner, attempt=attempt, expires=start.expires
            )
        )
    )
    return outcomes[0] if started else None


def _handed_back(start: PlainStart, exc: HABeatError) -> tuple[int, Any, float]:
    """A run nobody took yet whose take PostgreSQL could not record: its message goes
    back to the broker, as at a receipt that failed (``beat.delivery.receipts``), after
    a pause so that a worker cut off does not spin on it."""
    logger.error(
        "cannot check plain run %s against the run table, handing it back: %s",
        start.run_id,
        exc,
        extra={"run_id": str(start.run_id)},
    )
    metrics.WORKER_REQUEUED.inc()
    time.sleep(REQUEUE_DELAY)
    return _as_raised(Reject(str(exc), requeue=True))


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
    return _as_raised(Ignore("not started: see the log line before"))


def _as_raised(exc: Exception) -> tuple[int, Any, float]:
    """What Celery's trace hands the main process for a task that raised ``exc`` (an
    ``Ignore`` or a ``Reject``, which the request acts on), without running the body."""
    try:
        raise exc
    except Exception:
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
        return RunState.RETRYING, recorded_error(retval)
    error = recorded_error(retval) if isinstance(retval, BaseException) else None
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
    return run_store_for(delivery_config(task.app.conf).database_url)
