"""The receipt of a run beat published.

When the message of a run beat published reaches a worker
(``task_received``, in its main process), the run is held under a receipt
lease that the worker renews while the request is in its hands (reserved,
waiting for a retry's countdown, or running). If the worker dies before the
run starts, the lease expires and the leader publishes the run again at
once, rather than after the broker's visibility timeout. A plain task's receipt
also takes the run, or drops a delivery of a run taken before.

A request Celery runs at once (``_runs_at_once``: a free pool slot, no ETA, no rate
limit, not a redelivery) needs no receipt: the pool process takes a plain run and
starts it in one statement (``beat.delivery.plain_runs``), and the idempotent base's
guard takes its run as it starts. One statement a run less, and the main process,
which takes every message, waits for none.
"""

from __future__ import annotations

import logging
import time
import uuid
from datetime import datetime
from typing import Any

from celery.exceptions import TaskRevokedError

from beat import metrics
from beat.config import BeatConfig
from beat.delivery.app_config import delivery_config
from beat.delivery.heartbeat import WorkerHeartbeat, _leases_of
from beat.delivery.message_times import retry_due, run_expiry, seconds_until
from beat.delivery.plain_runs import (
    RECEIPT_KEY,
    REQUEUE_DELAY,
    PlainStart,
    _start_only_while_held,
    is_guarded,
)
from beat.delivery.workflow_steps import is_step, record_received_step
from beat.errors import HABeatError
from beat.models import RunState
from beat.publish.dispatch import published_by_beat
from beat.store.plain_runs import TAKEN_UNRECORDED
from beat.store.run_guard import Refused
from beat.store.runs import run_id_for

logger = logging.getLogger(__name__)


def _redelivered(request: Any) -> bool:
    """Whether the broker hands this message out again after a consumer took it (kombu
    marks a delivery it restored from its unacknowledged ones)."""
    delivery_info = getattr(request, "delivery_info", None) or {}
    return bool(delivery_info.get("redelivered"))


def _hold_received_run(sender: Any = None, request: Any = None, **_: Any) -> None:
    """Hold the run of a message beat published when it arrives; for a plain task, take
    the run, or drop the delivery if the run was taken before.

    Celery only logs what this handler raises, and runs the body: so nothing escapes.
    A plain run whose receipt cannot be recorded does not start. While PostgreSQL is
    unreachable its message goes back to the broker; after an error nobody expected it
    is acknowledged unrun, and the leader's lost-message recovery sends the run again
    (at most ``MAX_SENDS`` times, then it ends ``lost`` with the reason): a message
    handed back for ever would hold this worker's intake for as long."""
    if request is None:
        return
    context = request.request_dict
    if not published_by_beat(_Headers(context)):
        return
    context.pop(RECEIPT_KEY, None)  # a retry carries its parent's headers
    run_id = run_id_for(request.id)
    try:
        if _runs_at_once(sender, request):
            _take_at_start(request, context, run_id)
            return
        _take_on_receipt(request, context, run_id)
    except Exception as exc:
        unreachable = isinstance(exc, HABeatError)
        if is_guarded(request.task):  # its guard decides at its start
            logger.warning("could not record the receipt of run %s: %s", run_id, exc)
            return
        logger.error(
            "cannot check plain run %s against the run table, %s: %s",
            run_id,
            "handing it back" if unreachable else "not running it",
            exc,
            extra={"run_id": str(run_id)},
            exc_info=not unreachable,
        )
        metrics.WORKER_REQUEUED.inc()
        if unreachable:
            time.sleep(REQUEUE_DELAY)
        _drop(request, requeue=unreachable)


def _runs_at_once(consumer: Any, request: Any) -> bool:
    """Whether Celery hands this request to a free pool slot right after this signal:
    no ETA (a countdown; a retry's due time comes with one), no rate limit, not a
    redelivery (whose receipt checks who took it before), and fewer requests in hand
    than the pool has slots.

    Such a request needs no receipt of its own: the pool process takes the run as it
    starts it (one statement where a receipt and a start were two). A guess that is
    wrong (the pool slower to free a slot than counted) only leaves the run unrecorded
    while its request waits: the leader's lost-message recovery then counts it as
    stranded after ``UNRECORDED_AFTER`` and sends a copy, which one delivery only takes
    (``beat.leader.lost_messages``): waste, never a second execution."""
    from celery.worker import state

    pool = getattr(consumer, "pool", None)
    slots = getattr(pool, "num_processes", None)
    if not isinstance(slots, int) or request.eta is not None or _redelivered(request):
        return False
    if getattr(request.task, "rate_limit", None):
        return False
    return len(state.reserved_requests) < slots


def _take_at_start(request: Any, context: dict[str, Any], run_id: uuid.UUID) -> None:
    """A request that runs at once: the idempotent base's guard takes the run when it
    starts; a plain run is taken and started by the pool process, under this worker's
    receipt lease (renewed by its heartbeat from then on)."""
    config = delivery_config(request.task.app.conf)
    leases = _leases_of(config, request.hostname or "worker")
    if is_step(context):  # a workflow's step: its run, should its send not have made it
        record_received_step(leases.store, request, context)
    if not is_guarded(request.task):
        _to_the_pool(request, leases, run_id, config, attempt=None, expires=run_expiry(context))


def _take_on_receipt(request: Any, context: dict[str, Any], run_id: uuid.UUID) -> None:
    config = delivery_config(request.task.app.conf)
    leases = _leases_of(config, request.hostname or "worker")
    if is_step(context):  # a workflow's step: its run, should its send not have made it
        record_received_step(leases.store, request, context)
    expires = run_expiry(context)
    due = retry_due(context)
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
    _to_the_pool(request, leases, run_id, config, attempt=outcome.attempt, expires=expires)


def _to_the_pool(
    request: Any,
    leases: WorkerHeartbeat,
    run_id: uuid.UUID,
    config: BeatConfig,
    *,
    attempt: int | None,
    expires: datetime | None,
) -> None:
    """Hand a plain run's request to the pool behind its start (``attempt``: the one its
    receipt took; None: taken as it starts), its run listed among this worker's receipt
    leases."""
    leases.add(run_id, request.id)
    _start_only_while_held(
        request,
        PlainStart(
            run_id=run_id,
            owner=leases.owner,
            attempt=attempt,
            database_url=config.database_url,
            expires=expires,
            worker=request.hostname or "",
            lease_seconds=config.lease_timeout,
            retries=int(request.request_dict.get("retries") or 0),
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
