"""The worker side of the run table: the idempotency guard, leases and completion.

Every transition is one conditional statement; the row count (or the row
returned) says who won, so two deliveries of one run can never both start it,
and a worker whose lease was taken over can never record a completion.

A run may be started when it is ``pending`` or ``queued`` (new), ``retrying``
by a delivery at least as new as the last retry, or ``running`` under a lease
that has expired. Anything else is a duplicate delivery: refused and counted.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, and_, func, or_, update
from sqlalchemy.dialects.postgresql import insert as pg_insert

from beat.store import StoreConnection, create_store_engine
from beat.tables import RunState, runs


@dataclass(frozen=True, kw_only=True, slots=True)
class Started:
    """The delivery holds the run's lease."""

    attempt: int


@dataclass(frozen=True, kw_only=True, slots=True)
class Refused:
    """The delivery is a duplicate: the run is done, or another worker holds a live lease."""

    state: str
    lease_owner: str | None


def _lease_until(seconds: float) -> Any:
    return func.now() + func.make_interval(0, 0, 0, 0, 0, 0, seconds)


class RunStore(StoreConnection):
    """Run transitions made by workers (see the module docstring)."""

    @classmethod
    def connect(cls, url: str, *, pool_size: int = 5) -> RunStore:
        return cls(create_store_engine(url, pool_size=pool_size))

    def start(
        self,
        run_id: uuid.UUID,
        *,
        owner: str,
        worker: str,
        lease_seconds: float,
        task: str,
        args: list[Any],
        kwargs: dict[str, Any],
        options: dict[str, Any],
        retries: int,
        max_attempts: int,
    ) -> Started | Refused:
        """Take the run's lease if this delivery may run it (one statement), else record a refusal.

        A run that does not exist yet (a task sent with ``delay()``) is created,
        with its payload, so the reaper can publish it again.
        """
        lease = {
            "state": RunState.RUNNING.value,
            "lease_owner": owner,
            "lease_expires_at": _lease_until(lease_seconds),
            "started_at": func.now(),
            "worker": worker,
        }
        insert = pg_insert(runs).values(
            id=run_id,
            task=task,
            args=args,
            kwargs=kwargs,
            options=options,
            attempt=1,
            retries=retries,
            max_attempts=max_attempts,
            published_at=func.now(),
            **lease,
        )
        statement = insert.on_conflict_do_update(
            index_elements=[runs.c.id],
            set_=lease
            | {
                "attempt": runs.c.attempt + 1,
                "retries": func.greatest(runs.c.retries, insert.excluded.retries),
                "published_at": func.coalesce(runs.c.published_at, func.now()),
                "finished_at": None,
                "error": None,
            },
            where=or_(
                runs.c.state.in_([RunState.PENDING.value, RunState.QUEUED.value]),
                and_(
                    runs.c.state == RunState.RETRYING.value,
                    insert.excluded.retries >= runs.c.retries,
                ),
                and_(runs.c.state == RunState.RUNNING.value, runs.c.lease_expires_at < func.now()),
            ),
        ).returning(runs.c.attempt)
        with self._transaction() as conn:
            attempt = conn.execute(statement).scalar_one_or_none()
            if attempt is not None:
                return Started(attempt=attempt)
            row = conn.execute(
                update(runs)
                .where(runs.c.id == run_id)
                .values(duplicate_deliveries=runs.c.duplicate_deliveries + 1)
                .returning(runs.c.state, runs.c.lease_owner)
            ).one()
        return Refused(state=row.state, lease_owner=row.lease_owner)

    def heartbeat(self, run_id: uuid.UUID, *, owner: str, lease_seconds: float) -> bool:
        """Extend the lease; False if it is no longer ours (taken over, or the run moved on)."""
        with self._transaction() as conn:
            return (
                conn.execute(
                    update(runs)
                    .where(_held_by(run_id, owner))
                    .values(lease_expires_at=_lease_until(lease_seconds))
                ).rowcount
                == 1
            )

    def finish(
        self,
        run_id: uuid.UUID,
        *,
        owner: str,
        state: RunState,
        error: str | None = None,
        retries: int | None = None,
        conn: Connection | None = None,
    ) -> bool:
        """Record the outcome of the attempt if we still hold the lease; True if recorded.

        Pass ``conn`` to record it inside the task's own transaction, so its
        side effects commit together with the completion (or not at all).
        """
        values: dict[str, Any] = {
            "state": state.value,
            "error": error,
            "lease_owner": None,
            "lease_expires_at": None,
            "duration_seconds": func.extract("epoch", func.now() - runs.c.started_at),
        }
        if state is not RunState.RETRYING:
            values["finished_at"] = func.now()
        if retries is not None:
            values["retries"] = retries
        statement = update(runs).where(_held_by(run_id, owner)).values(**values)
        if conn is not None:
            return conn.execute(statement).rowcount == 1
        with self._transaction() as own:
            return own.execute(statement).rowcount == 1


def _held_by(run_id: uuid.UUID, owner: str) -> Any:
    return and_(
        runs.c.id == run_id,
        runs.c.state == RunState.RUNNING.value,
        runs.c.lease_owner == owner,
    )
