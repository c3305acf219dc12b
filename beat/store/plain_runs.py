"""The records of plain tasks' runs.

Plain tasks (not on the idempotent base) are taken once: at receipt, in the
worker's main process (``receive_plain``), when the request waits before it runs
(an ETA, a retry's countdown, a busy pool); else by the pool process just before
the body (``take_and_start_plain``: taken and started in one statement). Once
taken, a plain run is never started again, whoever delivers it. A body taken at
receipt starts only if that delivery still holds it (``start_plain``: the attempt
its receipt numbered, under that receipt's owner, not started): a delivery whose
receipt lease expired and whose run went to another worker does not run the body.
"""

from __future__ import annotations

import functools
import uuid
from datetime import datetime
from typing import Any

from sqlalchemy import (
    Double,
    Integer,
    and_,
    func,
    literal,
    or_,
    select,
    update,
)

from beat.models import WAITING_STATES, RunState
from beat.store.precompiled import execute, one_of
from beat.store.run_guard import (
    EXPIRES,
    LEASE_SECONDS,
    OWNER,
    RUN_ID,
    WORKER,
    Refused,
    RunGuard,
    Started,
    expire_instead,
    lease_binding,
    lease_until,
    literal_int,
    not_expired,
    outcome,
    outcome_binding,
    outcome_parameters,
    param,
    refuse,
    take_statement,
)
from beat.store.tables import TZ, runs, unrecorded_consumers

#: Why a plain run ends ``lost`` when its body never returned: Celery's trace was unwound
#: by a ``BaseException`` (a prefork pool process terminated with SIGTERM by a cancel or
#: a revoke, or the body raised ``SystemExit``).
PLAIN_RUN_TERMINATED = (
    "its body did not return (terminated by Celery while it ran): it may have had its"
    " effect; a plain task is not run again"
)
#: The same, when Celery says why: it cancels the requests it cannot acknowledge once
#: the worker lost its broker connection (``worker_cancel_long_running_tasks_on_connection_loss``).
CANCELLED_ON_CONNECTION_LOSS = (
    "cancelled by Celery when the worker lost its broker connection: it may have had its effect"
)

#: A plain run whose message came back from a consumer that records no runs.
TAKEN_UNRECORDED = (
    "its message came back from the broker after a consumer took it, and no worker"
    " recorded it, on a queue a consumer that records no runs takes from: that consumer"
    " may have run it; a plain task is not run again"
)


def _plain_attempt(run_id: Any, attempt_retries: Any) -> tuple[Any, ...]:
    """The plain run's attempt that Celery numbered ``attempt_retries``."""
    return (runs.c.id == run_id, runs.c.plain, runs.c.retries == attempt_retries)


def _at_least_zero(seconds: float | None) -> float | None:
    return None if seconds is None else max(0.0, seconds)


#: A plain run taken at receipt (``receive_plain``): held by the receipt's lease, not
#: started yet; the retry it is (if one) not due before its due time, kept from the
#: instant its message carries (``p_due_at``) or else the seconds to its ETA
#: (``p_due_in``): ``greatest`` passes over the one that is NULL.
_RECEIVE_PLAIN = take_statement(
    {
        "state": RunState.RUNNING.value,
        "plain": True,
        "received_at": func.now(),
        "started_at": None,
        "worker": WORKER,
        "lease_owner": OWNER,
        "lease_expires_at": lease_until(LEASE_SECONDS),
        "retry_due_at": func.greatest(
            runs.c.retry_due_at,
            param("due_at", TZ),
            lease_until(param("due_in", Double)),
        ),
    }
)


#: A plain run taken by the pool process that runs its body now
#: (``take_and_start_plain``): the receipt and the start in one statement.
_TAKE_AND_START_PLAIN = take_statement(
    {
        "state": RunState.RUNNING.value,
        "plain": True,
        "received_at": func.now(),
        "started_at": func.now(),
        "worker": WORKER,
        "lease_owner": OWNER,
        "lease_expires_at": lease_until(LEASE_SECONDS),
    }
)


def _held_by_receipt(run_id: Any, owner: Any, attempt: Any) -> Any:
    """The plain run still held by the receipt that numbered it ``attempt`` under ``owner``."""
    return and_(
        runs.c.id == run_id,
        runs.c.plain,
        runs.c.state == RunState.RUNNING.value,
        runs.c.attempt == attempt,
        runs.c.lease_owner == owner,
    )


_START_PLAIN = (
    update(runs)
    .where(_held_by_receipt(RUN_ID, OWNER, param("attempt", Integer)), not_expired(EXPIRES))
    .values(
        started_at=func.coalesce(runs.c.started_at, func.now()),
        first_started_at=func.coalesce(runs.c.first_started_at, func.now()),
    )
    .returning(runs.c.attempt)
)


@functools.cache
def _finish_plain(state: RunState) -> Any:
    """The statement that records ``state`` as a plain run's outcome (``finish_plain``)."""
    # An outcome the body reached replaces a ``lost`` written while it ran (the
    # reaper's, a cancel's); a ``lost`` itself replaces nothing but ``running``.
    ended = [RunState.RUNNING.value]
    if state is not RunState.LOST:
        ended.append(RunState.LOST.value)
    values = outcome_parameters(state, with_retries=state is RunState.RETRYING)
    return (
        update(runs)
        .where(
            *_plain_attempt(RUN_ID, param("attempt_retries", Integer)),
            one_of(runs.c.state, ended),
        )
        .values(**values)
    )


class PlainRuns(RunGuard):
    """The records of plain tasks' runs (see the module docstring)."""

    def receive_plain(
        self,
        run_id: uuid.UUID,
        *,
        owner: str,
        worker: str,
        lease_seconds: float,
        retries: int,
        expires: datetime | None = None,
        retry_due_at: datetime | None = None,
        retry_due_in: float | None = None,
    ) -> Started | Refused:
        """A worker took the message of a plain run: hold it (under ``owner``'s lease,
        renewed by ``heartbeat_received``) if it may start, else refuse the delivery;
        past ``expires`` by the database's clock, the run ends ``expired`` (refused).

        The message of a retry waits here for its countdown, until ``retry_due_at`` (the
        instant by the database's clock the retrying worker put in the message) or,
        without it, ``retry_due_in`` seconds (measured on this worker's clock from the
        ETA): the run keeps that due time, so that if this worker dies, the retry is
        not sent again before it. (The retry may arrive before the attempt that asked
        for it has recorded its outcome, and then only the receipt knows the due
        time.)"""
        bound = lease_binding(run_id, owner, worker, lease_seconds, retries, expires)
        bound["p_due_at"] = retry_due_at
        # Without the instant, the seconds measured on the worker's clock.
        bound["p_due_in"] = None if retry_due_at is not None else _at_least_zero(retry_due_in)
        return self._take(_RECEIVE_PLAIN, bound, run_id, retries, expires)

    def take_and_start_plain(
        self,
        run_id: uuid.UUID,
        *,
        owner: str,
        worker: str,
        lease_seconds: float,
        retries: int,
        expires: datetime | None = None,
    ) -> Started | Refused:
        """The plain run's body starts now, in a request that did not wait: take the run
        (under ``owner``'s receipt lease) and start it in one statement, if a delivery
        carrying ``retries`` may (as ``receive_plain`` would take it) and it has not
        expired by the database's clock; else the body must not run: a duplicate is
        refused, and past ``expires`` the run ends ``expired``."""
        bound = lease_binding(run_id, owner, worker, lease_seconds, retries, expires)
        return self._take(_TAKE_AND_START_PLAIN, bound, run_id, retries, expires)

    def start_plain(
        self, run_id: uuid.UUID, *, owner: str, attempt: int, expires: datetime | None = None
    ) -> Started | Refused:
        """The plain run's body starts now, if the delivery whose receipt numbered it
        ``attempt`` under ``owner`` still holds it (no other delivery took it since) and
        it has not expired by the database's clock (one statement); else the body must
        not run: past ``expires``, the run ends ``expired``. Each receipt numbers its
        own attempt, so only one start can pass; trying it again after a commit whose
        reply was lost passes again (the start time kept)."""
        bound = {"p_run_id": run_id, "p_owner": owner, "p_attempt": attempt, "p_expires": expires}
        with self._each_statement_commits() as conn:
            if execute(conn, _START_PLAIN, bound).scalar_one_or_none() is not None:
                return Started(attempt=attempt)
            held = _held_by_receipt(run_id, owner, literal_int(attempt))
            not_started = and_(held, runs.c.started_at.is_(None))
            return expire_instead(conn, run_id, not_started, expires) or refuse(conn, run_id)

    def finish_plain(
        self,
        run_id: uuid.UUID,
        *,
        state: RunState,
        error: str | None = None,
        attempt_retries: int,
        retry_in: float | None = None,
    ) -> bool:
        """Record the outcome of the plain run's attempt that Celery numbered
        ``attempt_retries`` (its ``request.retries``), unless a later attempt (the retry
        it asked for, received before this one ended) holds the run now."""
        retries = attempt_retries + 1 if state is RunState.RETRYING else None
        bound = outcome_binding(state, error=error, retries=retries, retry_in=retry_in)
        bound |= {"p_run_id": run_id, "p_attempt_retries": attempt_retries}
        with self._each_statement_commits() as conn:
            return bool(execute(conn, _finish_plain(state), bound).rowcount == 1)

    def cancel_plain(self, run_id: uuid.UUID, *, attempt_retries: int) -> bool:
        """Celery cancelled the attempt ``attempt_retries`` of a plain run on a lost broker
        connection, terminating its body: the run ends ``lost`` with
        ``CANCELLED_ON_CONNECTION_LOSS`` if its body started (it may have had its effect;
        it is never run again), also over the ``PLAIN_RUN_TERMINATED`` its pool process
        may have recorded first. A body that had returned recorded its outcome, which
        stays; one that never started is left to its receipt lease (sent again)."""
        return self._changed_one(
            update(runs)
            .where(
                *_plain_attempt(run_id, attempt_retries),
                runs.c.started_at.is_not(None),
                or_(
                    runs.c.state == RunState.RUNNING.value,
                    and_(
                        runs.c.state == RunState.LOST.value,
                        runs.c.error == PLAIN_RUN_TERMINATED,
                    ),
                ),
            )
            .values(
                **outcome(
                    RunState.LOST, error=CANCELLED_ON_CONNECTION_LOSS, retries=None, retry_in=None
                )
            )
        )

    def end_taken_unrecorded(self, run_id: uuid.UUID, *, queue: str) -> bool:
        """A delivery of a plain run that the broker hands out again (kombu restored it
        after a consumer took it without acknowledging it): if no worker ever recorded
        the run and a consumer that records no runs takes from ``queue``
        (``beat_unrecorded_consumers``), that consumer may have run it, and nothing can
        prove it did not. The run ends ``lost`` with the reason; True if it did (the
        delivery must not run). Otherwise the consumer that took it was a worker that
        records runs and died before it could (or handed it back): it may run."""
        taken_unrecorded = (
            select(literal(1))
            .select_from(unrecorded_consumers)
            .where(unrecorded_consumers.c.queue == queue)
            .exists()
        )
        return self._changed_one(
            update(runs)
            .where(
                runs.c.id == run_id,
                runs.c.state.in_(WAITING_STATES),
                runs.c.received_at.is_(None),
                runs.c.lease_owner.is_(None),
                taken_unrecorded,
            )
            .values(
                state=RunState.LOST.value,
                error=TAKEN_UNRECORDED,
                finished_at=func.now(),
            )
        )
