"""The idempotent task base: any Celery task becomes safe to deliver twice.

    @celery_app.task(base=IdempotentTask)
    def send_invoice(invoice_id: int) -> None: ...

Before the body runs, the delivery takes the run (task ID = run ID) in the
PostgreSQL run table with one conditional statement; a run that is finished,
or held by another worker's live lease, is skipped, acknowledged, logged and
counted (``duplicate_deliveries``). While the body runs, the process's run leases
(``beat.delivery.run_leases``: one thread and one statement for all the runs a
process executes) extend the lease every third of its length; if the lease is lost (another
worker reclaimed the run), ``self.lease_lost`` turns true and the completion
is refused. These events are also counted as ``habeat_worker_*`` Prometheus
metrics (see ``beat.metrics``; endpoint: ``HABEAT_WORKER_METRICS_PORT``).
Writes made through ``self.db`` commit in the same transaction as the
completion record: they happen once, or not at all.

Delivery is at least once (``acks_late``, ``reject_on_worker_lost``, broker
redelivery, the leader's reaper); completion is at most once per run.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from celery import Task
from celery.exceptions import Ignore, Reject, Retry
from celery.signals import worker_init
from sqlalchemy.exc import InterfaceError, OperationalError
from sqlalchemy.orm import Session

from beat import metrics
from beat.config import BeatConfig, uses_this_scheduler
from beat.delivery.app_config import delivery_config
from beat.delivery.links import (
    has_links,
    links_record,
    send_links_after_completion,
    send_links_left_unsent,
)
from beat.delivery.run_leases import run_leases_of
from beat.delivery.tracking import (
    REQUEUE_DELAY,
    recorded_error,
    retry_delay,
    run_expiry,
    seconds_until,
)
from beat.delivery.workflow_steps import is_step, record_started_step
from beat.errors import HABeatError, StoreUnavailable
from beat.lease.beacon import process_session
from beat.models import RunState
from beat.publish.dispatch import published_by_beat
from beat.store.run_guard import MISSING, Refused, Started
from beat.store.runs import RunStore, run_id_for, run_store_for

logger = logging.getLogger(__name__)

#: What a reclaimed ad hoc run needs to be published again as its caller sent it:
#: ``send_task`` options read from the first delivery's request (links, chain, chord,
#: group, lineage, limits, expiry). Values are JSON, as in the message itself.
REQUEST_OPTIONS = (
    "link",
    "link_error",
    "chain",
    "chord",
    "group_id",
    "group_index",
    "root_id",
    "parent_id",
    "reply_to",
    "expires",
    "time_limit",
    "soft_time_limit",
    "shadow",
)


class LeaseLost(HABeatError):
    """Another worker took over this run (our lease expired): stop; no result is recorded."""


@dataclass
class _Execution:
    """One attempt of one run, held on the task's (thread-local) request."""

    run_id: uuid.UUID
    owner: str
    store: RunStore
    lease_seconds: float
    heartbeat_every: float
    lost: threading.Event = field(default_factory=threading.Event)
    stop: threading.Event = field(default_factory=threading.Event)
    session: Session | None = None
    started: float = field(default_factory=time.monotonic)
    #: The retry this attempt asked for was recorded before Celery published it.
    retry_recorded: bool = False
    #: Keeps this process's beacon (``beat.lease.beacon``): a half it lost is opened again
    #: while the run runs, also in a pool process that has no other timer.
    keep_beacon: Callable[[], object] = lambda: None

    #: Until when the lease is known to hold (``time.monotonic()``): ``lease_seconds``
    #: after the statement that took or last extended it was sent.
    valid_until: float = 0.0

    def finishing(self) -> bool:
        """Its outcome is being recorded: a lease that ends now was not lost."""
        return self.stop.is_set()

    def lose(self, reason: str) -> None:
        self.lost.set()
        metrics.WORKER_LEASE_LOSSES.inc()
        logger.warning(
            "lost the lease on run %s: %s; its completion will not be recorded",
            self.run_id,
            reason,
            extra={"run_id": str(self.run_id)},
        )


class IdempotentTask(Task):  # type: ignore[misc]  # celery is untyped
    """Base class of tasks whose every run completes at most once (see module docstring)."""

    acks_late = True
    reject_on_worker_lost = True
    #: Tells the worker's run tracking (``beat.delivery.tracking``) that this task guards
    #: its own runs: it records plain tasks only.
    habeat_guarded = True
    #: Defaults for ``autoretry_for``: exponential back-off (1 s, 2 s, 4 s, ... capped at
    #: 10 minutes) with full jitter, at most 5 retries.
    retry_backoff = True
    retry_backoff_max = 600
    retry_jitter = True
    max_retries = 5

    # -- what the task body can use ---------------------------------------------------

    @property
    def db(self) -> Session:
        """A session whose writes commit with this run's completion record (or not at all)."""
        execution = self._execution()
        if execution is None:
            raise RuntimeError("self.db is only available while a delivered run executes")
        if execution.session is None:
            execution.session = Session(bind=execution.store.engine)
        return execution.session

    @property
    def lease_lost(self) -> bool:
        """True once another worker may have taken this run over: stop work that can be stopped."""
        execution = self._execution()
        return execution is not None and execution.lost.is_set()

    def check_lease(self) -> None:
        """Raise :class:`LeaseLost` if the lease was lost (call it between steps of long work)."""
        if self.lease_lost:
            raise LeaseLost

    # -- the guard ----------------------------------------------------------------------

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        request = self.request
        if request.id is None or request.called_directly or request.is_eager:
            return super().__call__(*args, **kwargs)
        config = delivery_config(self.app.conf)
        store = run_store_for(config.database_url)
        run_id = run_id_for(request.id)
        owner = f"{request.hostname or 'worker'}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        try:
            if self._expired(store, run_id):
                raise Ignore
            taken_at = time.monotonic()
            outcome = self._start(store, run_id, owner, config, args, kwargs)
            if _step_made(store, self, outcome):  # a workflow's step nobody could record
                outcome = self._start(store, run_id, owner, config, args, kwargs)
            # The start refuses a run whose expiry passed after the check above (the
            # check, then the start, are two statements some milliseconds apart), and
            # ends it expired.
            if isinstance(outcome, Refused) and (
                outcome.state == RunState.EXPIRED.value or self._expired(store, run_id)
            ):
                raise Ignore
        except StoreUnavailable as exc:
            # Without the guard the run must not start, nor be acknowledged as done:
            # hand the message back so a worker that reaches PostgreSQL takes it.
            logger.error(
                "cannot check run %s against the run table, handing it back: %s",
                run_id,
                exc,
                extra={"run_id": str(run_id)},
            )
            metrics.WORKER_REQUEUED.inc()
            time.sleep(REQUEUE_DELAY)  # do not spin on the message while cut off
            raise Reject(str(exc), requeue=True) from exc
        if isinstance(outcome, Refused) and outcome.state == MISSING:
            metrics.WORKER_DUPLICATE_DELIVERIES.inc()
            logger.warning(
                "skipped a delivery of run %s (%s): beat published it, but its record is gone"
                " (withdrawn by an edit of its schedule before its fire time, deleted by"
                " history retention long after it ran, or by hand)",
                run_id,
                self.name,
                extra={"run_id": str(run_id)},
            )
            raise Ignore
        if isinstance(outcome, Refused):
            if outcome.state == RunState.SUCCEEDED.value and has_links(request):
                send_links_left_unsent(
                    self.app, request, store, run_id, settle_seconds=config.lease_timeout
                )
            metrics.WORKER_DUPLICATE_DELIVERIES.inc()
            logger.warning(
                "skipped a duplicate delivery of run %s (%s): it is %s%s",
                run_id,
                self.name,
                outcome.state,
                f" under the lease of {outcome.lease_owner}" if outcome.lease_owner else "",
                extra={"run_id": str(run_id), "state": outcome.state},
            )
            raise Ignore
        execution = _Execution(
            run_id=run_id,
            owner=owner,
            store=store,
            lease_seconds=config.lease_timeout,
            heartbeat_every=config.lease_heartbeat,
            keep_beacon=lambda: process_session(config),
            valid_until=taken_at + config.lease_timeout,
        )
        return self._execute(execution, args, kwargs)

    def _expires(self) -> datetime | None:
        """When the delivery's run expires, by the database's clock (None: it does not);
        not the ``expires`` Celery checks, which is moved onto this worker's clock."""
        return run_expiry(vars(self.request))

    def _expired(self, store: RunStore, run_id: uuid.UUID) -> bool:
        """Celery discards an expired message by this worker's clock, before the task
        code; this is the same check by the database's clock, which the expiry was
        computed from, just before the run would start."""
        moment = self._expires()
        if moment is None:
            return False
        if not store.expire_if_past(run_id, moment):
            return False
        logger.warning(
            "run %s (%s) expired at %s before it started: not run",
            run_id,
            self.name,
            moment.isoformat(),
            extra={"run_id": str(run_id)},
        )
        return True

    def _start(
        self,
        store: RunStore,
        run_id: uuid.UUID,
        owner: str,
        config: BeatConfig,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> Started | Refused:
        request = self.request
        return store.start(
            run_id,
            owner=owner,
            worker=request.hostname or "",
            lease_seconds=config.lease_timeout,
            task=self.name,
            args=list(args),
            kwargs=dict(kwargs),
            options=_publish_options(request),
            retries=request.retries or 0,
            max_attempts=config.max_attempts,
            # A run beat published has a row from its claim: without one, it was
            # deleted by retention after the run ended, and must not run again.
            may_create=not published_by_beat(request),
            task_id=None if str(run_id) == request.id else request.id,
            expires=self._expires(),
            session=process_session(config),
        )

    def _execute(self, execution: _Execution, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        self.request.habeat_execution = execution
        leases = run_leases_of(execution.store, execution.heartbeat_every)
        leases.keep_beacon = execution.keep_beacon
        leases.hold(execution)
        try:
            result = super().__call__(*args, **kwargs)
        except Retry as retry:
            if not execution.retry_recorded:
                self._finish(
                    execution,
                    RunState.RETRYING,
                    retries=(self.request.retries or 0) + 1,
                    retry_in=retry_delay(retry),
                )
            raise
        except Ignore:
            self._finish(execution, RunState.CANCELLED, error="ignored by the task")
            raise
        except Exception as exc:
            if not _outcome(self, execution, RunState.FAILED, error=recorded_error(exc)):
                # The run is another delivery's now: Celery must not store this attempt's
                # failure either (a chord would count it, and never the run's success).
                raise Ignore from exc
            raise
        finally:
            execution.stop.set()
            leases.release(execution)
            self.request.habeat_execution = None
        links = links_record(result) if has_links(self.request) else None
        if not _outcome(self, execution, RunState.SUCCEEDED, unsent_links=links):
            raise Ignore  # another worker owns the run now: its outcome is the one recorded
        if links is not None:
            send_links_after_completion(self.app, self.request, execution.store, result)
        return result

    def apply_async(
        self,
        args: Any = None,
        kwargs: Any = None,
        task_id: str | None = None,
        **options: Any,
    ) -> Any:
        """Publish the task; a retry of the run executing now is recorded first.

        Celery publishes a retry inside ``self.retry()``, before the attempt that asked
        for it ends: a retry due at once may reach a worker first. Recording
        ``retrying`` (with its due time) before the publish lets that delivery in, and
        a retry whose message is then lost is found by the leader past its due time."""
        execution = self._execution()
        retries = options.get("retries") or 0
        if (
            execution is not None
            and not execution.retry_recorded
            and task_id == self.request.id
            and retries > (self.request.retries or 0)
        ):
            execution.retry_recorded = self._finish(
                execution,
                RunState.RETRYING,
                retries=retries,
                retry_in=seconds_until(options.get("eta") or options.get("countdown")),
            )
        return super().apply_async(args, kwargs, task_id=task_id, **options)

    def _finish(
        self,
        execution: _Execution,
        state: RunState,
        *,
        error: str | None = None,
        retries: int | None = None,
        retry_in: float | None = None,
        unsent_links: dict[str, Any] | None = None,
    ) -> bool:
        """Record the outcome; with ``self.db`` used, in its transaction (success commits it).
        Nothing is recorded once the lease was lost (``_Execution.lose``): the outcome,
        whatever it is, is refused, the effects made through ``self.db`` are rolled back,
        and the leader's reaper sends the run again."""
        session = execution.session
        execution.stop.set()  # the lease ends with this record: a renewal refused is not a loss
        if execution.lost.is_set():
            if session is not None:
                session.rollback()
                session.close()
            return False
        try:
            if session is not None and state is not RunState.SUCCEEDED:
                session.rollback()  # the effects of a failed attempt are not kept
            recorded = execution.store.finish(
                execution.run_id,
                owner=execution.owner,
                state=state,
                error=error,
                retries=retries,
                retry_in=retry_in,
                unsent_links=unsent_links,
                conn=None if session is None else session.connection(),
            )
            if session is not None:
                session.commit() if recorded else session.rollback()
        finally:
            if session is not None:
                session.close()
        if recorded and state.value in metrics.WORKER_RUN_STATES:
            metrics.WORKER_RUN_DURATION.labels(state=state.value).observe(
                time.monotonic() - execution.started
            )
        if not recorded:
            logger.warning(
                "did not record run %s as %s:"
                " this worker no longer holds it (taken over or cancelled)",
                execution.run_id,
                state.value,
                extra={"run_id": str(execution.run_id)},
            )
        return recorded

    def _execution(self) -> _Execution | None:
        execution: _Execution | None = getattr(self.request, "habeat_execution", None)
        return execution


def _step_made(store: RunStore, task: IdempotentTask, outcome: Started | Refused) -> bool:
    """For a workflow's step refused because it has no row (neither its send nor its
    receipt could record it: PostgreSQL unreachable then, or a sender without this
    package), make its row now; True if this made it, and the start is tried again."""
    context = vars(task.request)
    if not (isinstance(outcome, Refused) and outcome.state == MISSING and is_step(context)):
        return False
    return record_started_step(store, task.name, context)


def _outcome(task: IdempotentTask, execution: _Execution, state: RunState, **values: Any) -> bool:
    """``IdempotentTask._finish``; an outcome PostgreSQL cannot take hands the message back
    instead of letting Celery store a result the run table does not have (a chord would
    count a failure, or a success that may yet be undone): the run goes on under its
    lease, and is sent again once that ends."""
    try:
        return task._finish(execution, state, **values)
    # The task's own session (``self.db``) raises SQLAlchemy's errors as they are.
    except (StoreUnavailable, OperationalError, InterfaceError) as exc:
        logger.error(
            "could not record run %s as %s, handing its message back: %s",
            execution.run_id,
            state.value,
            exc,
            extra={"run_id": str(execution.run_id)},
        )
        metrics.WORKER_REQUEUED.inc()
        time.sleep(REQUEUE_DELAY)
        raise Reject(str(exc), requeue=True) from exc


@worker_init.connect  # type: ignore[untyped-decorator]
def _serve_worker_metrics(sender: Any = None, **_: Any) -> None:
    """Open the worker's metrics endpoint in its main process, if
    ``habeat_worker_metrics_port`` is set (``HABEAT_WORKER_METRICS_PORT``)."""
    app: Any = getattr(sender, "app", None)
    if app is None or not uses_this_scheduler(app.conf):
        return
    config = BeatConfig.from_celery_conf(app.conf)
    port, address = config.worker_metrics_port, config.metrics_address
    if not port:
        return
    prefork = _is_prefork(sender)
    if prefork and not metrics.multiprocess_mode():
        logger.warning(
            "the prefork pool runs tasks in child processes: the metrics endpoint on port %s"
            " shows their counts only with %s set to an empty directory; set it, or use"
            " -P threads",
            port,
            metrics.MULTIPROC_ENV,
        )
    try:
        metrics.start_metrics_server(int(port), address, multiprocess=prefork)
    except OSError as exc:  # running tasks matters more than their metrics
        logger.error("cannot serve worker metrics on %s:%s: %s", address, port, exc)


def _is_prefork(worker: Any) -> bool:
    from celery import concurrency

    try:
        pool = concurrency.get_implementation(worker.pool_cls)
    except Exception:  # an unknown pool: assume it shares our process
        return False
    return getattr(pool, "__module__", "") == "celery.concurrency.prefork"


def _publish_options(request: Any) -> dict[str, Any]:
    """How the delivery was sent, so a reclaimed run is published again the same way:
    to the same queue, with its links, chain and lineage (see ``REQUEST_OPTIONS``)."""
    execution = request.as_execution_options()
    options = {
        key: execution[key] for key in REQUEST_OPTIONS if execution.get(key) not in (None, [])
    }
    delivery = request.delivery_info or {}
    queue = delivery.get("routing_key")
    if queue:
        options["queue"] = queue
    if delivery.get("priority") is not None:
        options["priority"] = delivery["priority"]
    return options
