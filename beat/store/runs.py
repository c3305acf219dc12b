"""The worker side of the run table, as one store (:class:`RunStore`) composed of
its parts: the idempotency guard (``beat.store.run_guard``), plain tasks' runs
(``beat.store.plain_runs``) and the reads of the run history
(``beat.store.history``); here, the leases and completion of a run once taken, a
delivery discarded or expired, and worker presence.

Every transition is one conditional statement; the row count (or the row
returned) says who won, so a worker whose lease was taken over can never record
a completion.
"""

from __future__ import annotations

import functools
import os
import uuid
from collections.abc import Collection
from datetime import datetime
from typing import Any

from sqlalchemy import (
    Connection,
    Text,
    and_,
    any_,
    bindparam,
    case,
    func,
    or_,
    select,
    update,
)
from sqlalchemy.dialects.postgresql import ARRAY, JSONB, UUID
from sqlalchemy.dialects.postgresql import insert as pg_insert

from beat.models import WAITING_STATES, RunState
from beat.process_locks import ForkSafeLock
from beat.records import Session
from beat.store.db import create_store_engine
from beat.store.history import RunHistory
from beat.store.pg_arrays import parallel_arrays, text_array, uuid_array
from beat.store.plain_runs import PlainRuns
from beat.store.precompiled import execute
from beat.store.rows import due_again
from beat.store.run_guard import (
    EXPIRES,
    LEASE_SECONDS,
    OWNER,
    RUN_ID,
    WORKER,
    expired_values,
    expiry_reason,
    lease_until,
    outcome_binding,
    outcome_parameters,
    param,
)
from beat.store.run_links import RunLinks
from beat.store.tables import runs, workers
from beat.store.workflow_steps import WorkflowSteps

#: Namespace of the run IDs derived from task IDs that are not UUIDs (caller-chosen keys).
TASK_ID_NAMESPACE = uuid.UUID("6c1b1f0e-8a43-4c59-9a0e-686162656174")


def run_id_for(task_id: str) -> uuid.UUID:
    """The run ID of a task ID: itself if it is a UUID, else a stable UUID derived from it."""
    try:
        return uuid.UUID(task_id)
    except ValueError:
        return uuid.uuid5(TASK_ID_NAMESPACE, task_id)


_stores: dict[tuple[int, str], RunStore] = {}
_stores_lock = ForkSafeLock()


def run_store_for(url: str) -> RunStore:
    """One store per process and database: a forked pool child makes its own engine."""
    key = (os.getpid(), url)
    with _stores_lock:
        store = _stores.get(key)
        if store is None:
            store = _stores[key] = RunStore.connect(url)
    return store


class RunStore(PlainRuns, RunHistory, RunLinks, WorkflowSteps):
    """Run transitions made by workers (see the module docstring), and the run history."""

    @classmethod
    def connect(cls, url: str, *, pool_size: int = 5) -> RunStore:
        # A worker's every use is one statement: its pool checks a connection by its
        # socket, not by a ping that would double the round trips of each transition.
        return cls(create_store_engine(url, pool_size=pool_size, ping=False))

    def note_received(
        self, run_id: uuid.UUID, *, owner: str, worker: str, lease_seconds: float
    ) -> bool:
        """A worker took the message of a run it has not started (the idempotent base
        starts it later, in the pool): hold it under ``owner``'s receipt lease, so that
        if the worker dies before starting it the leader publishes it again at once
        instead of waiting for the broker's visibility timeout."""
        bound = {
            "p_run_id": run_id,
            "p_owner": owner,
            "p_worker": worker,
            "p_lease_seconds": lease_seconds,
        }
        return self._changed_one(_NOTE_RECEIVED, bound)

    def worker_seen(
        self, name: str, *, pid: int, booted_at: datetime, session: Session | None = None
    ) -> None:
        """The worker ``name`` (its process ``pid``, started at ``booted_at`` by the
        database's clock, keeping the beacon ``session``) is alive."""
        statement = pg_insert(workers).values(
            name=name,
            pid=pid,
            booted_at=booted_at,
            seen_at=func.now(),
            session_pid=None,  # the beacon's session is in beat_beacons
            beacon=None if session is None else session.beacon,
        )
        with self._transaction() as conn:
            conn.execute(
                statement.on_conflict_do_update(
                    index_elements=[workers.c.name],
                    set_={
                        "pid": statement.excluded.pid,
                        "booted_at": statement.excluded.booted_at,
                        "seen_at": func.now(),
                        "session_pid": statement.excluded.session_pid,
                        "beacon": statement.excluded.beacon,
                    },
                )
            )

    def heartbeat_received(
        self, owner: str, run_ids: Collection[uuid.UUID], *, lease_seconds: float
    ) -> int:
        """Extend ``owner``'s receipt leases on the runs it still has in hand (plain runs
        running, others not started yet)."""
        if not run_ids:
            return 0
        with self._each_statement_commits() as conn:
            return conn.execute(
                update(runs)
                .where(
                    runs.c.id == any_(bindparam("ids", type_=ARRAY(UUID(as_uuid=True)))),
                    runs.c.lease_owner == owner,
                )
                .values(lease_expires_at=lease_until(lease_seconds)),
                {"ids": list(run_ids)},
            ).rowcount

    def expire_if_past(self, run_id: uuid.UUID, expires: datetime) -> bool:
        """End the run ``expired`` if ``expires`` has passed by the database's clock
        and no worker started it; True if it did (the delivery must not run)."""
        bound = {"p_run_id": run_id, "p_expires": expires, "p_reason": expiry_reason(expires)}
        return self._changed_one(_EXPIRE_IF_PAST, bound)

    def end_discarded(
        self, run_id: uuid.UUID, *, expires: datetime, owner: str, attempt: int | None = None
    ) -> str | None:
        """Celery discarded a delivery of the run because its ``expires`` passed by the
        worker's clock, before any task code ran. The database's clock decides (one
        statement): expired by it, the run ends ``expired``; not expired, the worker's
        clock was wrong and the run goes back to the outbox (``pending``) to be sent
        again, not before a retry is due. Either only if no other delivery holds it: it
        is waiting (unleased, or under ``owner``'s receipt lease, or one that expired),
        or it is the plain run this delivery took at receipt (``attempt`` under
        ``owner``) and never started. Returns the run's new state, or None."""
        expired = func.now() >= expires
        free = or_(
            runs.c.lease_owner.is_(None),
            runs.c.lease_owner == owner,
            runs.c.lease_expires_at < func.now(),
        )
        discarded = and_(runs.c.state.in_(WAITING_STATES), free)
        if attempt is not None:
            held = and_(
                runs.c.plain,
                runs.c.state == RunState.RUNNING.value,
                runs.c.attempt == attempt,
                runs.c.lease_owner == owner,
                runs.c.started_at.is_(None),
            )
            discarded = or_(discarded, held)
        back = RunState.PENDING.value
        statement = (
            update(runs)
            .where(runs.c.id == run_id, discarded)
            .values(
                state=case((expired, RunState.EXPIRED.value), else_=back),
                reason=case((expired, expiry_reason(expires)), else_=runs.c.reason),
                finished_at=case((expired, func.now()), else_=None),
                lease_owner=None,
                lease_expires_at=None,
                not_before=case((expired, runs.c.not_before), else_=due_again()),
                # Sent again: no time of the deliveries before it stays (as the reaper).
                published_at=case((expired, runs.c.published_at), else_=None),
                received_at=case((expired, runs.c.received_at), else_=None),
                started_at=case((expired, runs.c.started_at), else_=None),
            )
            .returning(runs.c.state)
        )
        with self._each_statement_commits() as conn:
            state: str | None = conn.execute(statement).scalar_one_or_none()
            return state

    def database_now(self) -> datetime:
        """PostgreSQL's clock, read as late in the round trip as the server can."""
        with self._each_statement_commits() as conn:
            now: datetime = conn.execute(select(func.clock_timestamp())).scalar_one()
            return now

    def renew_run_leases(
        self, held: Collection[tuple[uuid.UUID, str]], *, lease_seconds: float
    ) -> set[uuid.UUID]:
        """Extend the leases of the runs a worker process executes, each ``(run, owner)``
        while ``owner`` still holds it, in one statement for all of them; the runs
        whose lease was extended (another is no longer this delivery's)."""
        if not held:
            return set()
        statement = (
            update(runs)
            .where(
                runs.c.id == _HELD.c.ids,
                runs.c.lease_owner == _HELD.c.owners,
                runs.c.state == RunState.RUNNING.value,
            )
            .values(lease_expires_at=lease_until(lease_seconds))
            .returning(runs.c.id)
        )
        parameters = {
            "ids": uuid_array(run_id for run_id, _ in held),
            "owners": text_array(owner for _, owner in held),
        }
        with self._each_statement_commits() as conn:
            return set(conn.execute(statement, parameters).scalars())

    def heartbeat(self, run_id: uuid.UUID, *, owner: str, lease_seconds: float) -> bool:
        """Extend the lease; False if it is no longer ours (taken over, or the run moved on)."""
        return self._changed_one(
            update(runs)
            .where(_held_by(run_id, owner))
            .values(lease_expires_at=lease_until(lease_seconds))
        )

    def finish(
        self,
        run_id: uuid.UUID,
        *,
        owner: str,
        state: RunState,
        error: str | None = None,
        retries: int | None = None,
        retry_in: float | None = None,
        unsent_links: dict[str, Any] | None = None,
        conn: Connection | None = None,
    ) -> bool:
        """Record the outcome of the attempt if we still hold the lease; True if recorded.

        Pass ``conn`` to record it inside the task's own transaction, so its
        side effects commit together with the completion (or not at all).
        A retry is due ``retry_in`` seconds from now (``retry_due_at``): past it, the
        leader looks for its message. ``unsent_links``: what the run's callbacks and
        chain are sent with, kept until they are (``beat.store.run_links``).
        """
        statement = _finish(
            state, with_retries=retries is not None, with_links=unsent_links is not None
        )
        bound = outcome_binding(state, error=error, retries=retries, retry_in=retry_in)
        bound |= {"p_run_id": run_id, "p_owner": owner}
        if unsent_links is not None:
            bound["p_unsent_links"] = unsent_links
        if conn is not None:
            return execute(conn, statement, bound).rowcount == 1
        with self._each_statement_commits() as own:
            return execute(own, statement, bound).rowcount == 1


#: A run the idempotent base has not started, held under the receipt lease.
_NOTE_RECEIVED = (
    update(runs)
    .where(runs.c.id == RUN_ID, runs.c.state.in_(WAITING_STATES))
    .values(
        received_at=func.now(),
        worker=WORKER,
        lease_owner=OWNER,
        lease_expires_at=lease_until(LEASE_SECONDS),
    )
)

_EXPIRE_IF_PAST = (
    update(runs)
    .where(runs.c.id == RUN_ID, runs.c.state.in_(WAITING_STATES), func.now() >= EXPIRES)
    .values(**expired_values(param("reason", Text)))
)


@functools.cache
def _finish(state: RunState, *, with_retries: bool, with_links: bool = False) -> Any:
    """The statement that records ``state`` as the outcome of the attempt that holds
    the run's lease (``finish``)."""
    values = outcome_parameters(state, with_retries=with_retries)
    if with_links:
        values["unsent_links"] = param("unsent_links", JSONB)
    return update(runs).where(_held_by(RUN_ID, OWNER)).values(**values)


#: The runs a worker process executes and the owner of each one's lease.
_HELD = parallel_arrays("held", ids=UUID(as_uuid=True), owners=Text)


def _held_by(run_id: Any, owner: Any) -> Any:
    return and_(
        runs.c.id == run_id,
        runs.c.state == RunState.RUNNING.value,
        runs.c.lease_owner == owner,
    )
