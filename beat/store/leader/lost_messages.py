"""Lost-message recovery's statements (``beat.leader.lost_messages``): runs no worker
took, sent again or ended ``lost`` at the bound, ended ``expired`` when their
``expires`` passed, and the consumers found not to record runs."""

from __future__ import annotations

import uuid
from collections.abc import Collection, Sequence
from typing import Any

from sqlalchemy import Row, and_, any_, bindparam, case, delete, func, or_, select, update
from sqlalchemy.dialects.postgresql import ARRAY, UUID
from sqlalchemy.dialects.postgresql import insert as pg_insert

from beat.models import RunState
from beat.store.leader.base import FencedStore, _run_from_row
from beat.store.leader.records import LostRun, Reclaim, Unconfirmed, UnrecordedConsumer
from beat.store.tables import runs, unrecorded_consumers
from beat.store.workflow_steps import has_no_recorded_step

#: A run's message is sent at most this many times while no worker records it (its
#: publication, and the copies sent because the broker seemed to have lost it: by
#: lost-message recovery, ``requeue_missing``, or past the visibility timeout,
#: ``reclaim``); then the run ends ``lost``.
MAX_SENDS = 3


class LostMessageStatements(FencedStore):
    """Runs whose message the broker may have lost, and the consumers that record nothing."""

    def unconfirmed_runs(self, *, older_than: float, limit: int) -> Unconfirmed:
        """Runs whose message a worker should have taken by now but no worker has: ``queued``
        for more than ``older_than`` seconds, or ``retrying`` for that long past the time
        their retry was due. Their message may be lost (the caller asks the broker)."""
        overdue = func.now() - func.make_interval(0, 0, 0, 0, 0, 0, older_than)
        query = (
            select(runs, func.now().label("now"))
            .where(
                or_(
                    and_(runs.c.state == RunState.QUEUED.value, runs.c.published_at < overdue),
                    and_(runs.c.state == RunState.RETRYING.value, runs.c.retry_due_at < overdue),
                ),
                # A worker holds it (receipt lease): if that worker dies, the reaper acts.
                runs.c.lease_owner.is_(None),
                # A workflow whose steps are recorded: its steps are looked for, not it.
                has_no_recorded_step(),
            )
            .order_by(runs.c.published_at)
            .limit(limit)
        )
        with self._transaction() as conn:
            rows = list(conn.execute(query))
            now = rows[0].now if rows else conn.execute(select(func.now())).scalar_one()
        return Unconfirmed(
            runs=[_run_from_row(row) for row in rows],
            now=now,
            published_at={row.id: row.published_at for row in rows},
        )

    def requeue_missing(
        self,
        epoch: int,
        run_ids: Sequence[uuid.UUID],
        *,
        max_sends: int = MAX_SENDS,
        idle_timeout: float = 10.0,
    ) -> Reclaim:
        """Put runs whose message the broker lost back in the outbox, as leader ``epoch``
        (fenced), unless a worker took them meanwhile: the runs to publish again. A run
        whose message was sent ``max_sends`` times already (its first publication and
        the copies sent by this recovery, ``recovery_sends``) ends ``lost`` instead: a
        consumer that records nothing may have taken every copy."""
        if not run_ids:
            return Reclaim(runs=[], lost=[])
        statement = (
            update(runs)
            .where(
                runs.c.id == any_(bindparam("ids", type_=ARRAY(UUID(as_uuid=True)))),
                runs.c.state.in_([RunState.QUEUED.value, RunState.RETRYING.value]),
            )
            .values(**_sent_again_or_lost(max_sends), epoch=epoch, claimed_at=func.now())
            .returning(*runs.c)
        )
        with self._transaction() as conn:
            self._fence(conn, epoch, idle_timeout)
            rows = list(conn.execute(statement, {"ids": list(run_ids)}))
        return Reclaim(
            runs=[_run_from_row(row) for row in rows if row.state == RunState.PENDING.value],
            lost=[
                LostRun(id=row.id, schedule_name=row.schedule_name, error=row.error)
                for row in rows
                if row.state == RunState.LOST.value
            ],
        )

    def record_consumers(
        self,
        epoch: int,
        found: Sequence[tuple[str, str]],
        *,
        forget_after: float,
        answered: bool = True,
        recording: Collection[str] = (),
        idle_timeout: float = 10.0,
    ) -> list[UnrecordedConsumer]:
        """Record what a check of the consumers found, as leader ``epoch`` (fenced):
        ``found`` (queue, consumer) pairs are seen now; a pair recorded before and not
        found is gone since now (unless nobody ``answered`` the check); a pair last seen
        more than ``forget_after`` seconds ago is deleted, and so is every pair of a
        consumer now known to record runs (``recording``: a worker that answered the
        control before its presence was written, as one just restarted, was taken for
        one that records nothing). Returns the pairs new or back since the last check
        (to say so once)."""
        table = unrecorded_consumers
        pairs = set(found)
        with self._transaction() as conn:
            self._fence(conn, epoch, idle_timeout)
            conn.execute(
                delete(table).where(
                    or_(
                        table.c.seen_at
                        < func.now() - func.make_interval(0, 0, 0, 0, 0, 0, forget_after),
                        table.c.consumer.in_(list(recording)),
                    )
                )
            )
            known = {
                (row.queue, row.consumer): row.gone_at is None
                for row in conn.execute(select(table.c.queue, table.c.consumer, table.c.gone_at))
            }
            # A check nobody answered tells nothing of the consumers it did not name.
            for queue, consumer in known.keys() - pairs if answered else ():
                conn.execute(
                    update(table)
                    .where(table.c.queue == queue, table.c.consumer == consumer)
                    .where(table.c.gone_at.is_(None))
                    .values(gone_at=func.now())
                )
            rows = [
                conn.execute(
                    pg_insert(table)
                    .values(queue=queue, consumer=consumer)
                    .on_conflict_do_update(
                        index_elements=[table.c.queue, table.c.consumer],
                        set_={"seen_at": func.now(), "gone_at": None},
                    )
                    .returning(*table.c)
                ).one()
                for queue, consumer in sorted(pairs)
            ]
        return [_consumer_from_row(row) for row in rows if not known.get((row.queue, row.consumer))]

    def unrecorded_consumers(self) -> list[UnrecordedConsumer]:
        """The consumers that do not record runs, as the leader last found them, by queue."""
        table = unrecorded_consumers
        query = select(table).order_by(table.c.queue, table.c.consumer)
        with self._transaction() as conn:
            return [_consumer_from_row(row) for row in conn.execute(query)]

    def expire_runs(
        self, epoch: int, run_ids: Sequence[uuid.UUID], *, idle_timeout: float = 10.0
    ) -> int:
        """End runs whose ``expires`` passed before any worker started them (fenced)."""
        if not run_ids:
            return 0
        statement = (
            update(runs)
            .where(
                runs.c.id == any_(bindparam("ids", type_=ARRAY(UUID(as_uuid=True)))),
                runs.c.state.in_(
                    [RunState.PENDING.value, RunState.QUEUED.value, RunState.RETRYING.value]
                ),
            )
            .values(
                state=RunState.EXPIRED.value,
                reason="expired before a worker started it (the leader found no message for it)",
                finished_at=func.now(),
                epoch=epoch,
            )
        )
        with self._transaction() as conn:
            self._fence(conn, epoch, idle_timeout)
            return conn.execute(statement, {"ids": list(run_ids)}).rowcount


def _sent_again_or_lost(max_sends: int) -> dict[str, Any]:
    """The values of a run whose message is presumed lost, no worker having recorded it:
    back to the outbox, or ``lost`` once its message was sent ``max_sends`` times (its
    publication and the copies sent since, counted in ``recovery_sends``)."""
    sent = 1 + runs.c.recovery_sends
    at_bound = sent >= max_sends
    given_up = func.concat(
        "its message was sent ",
        sent,
        " times and no worker recorded it: a consumer that does not record runs may have taken it",
    )
    return {
        "state": case((at_bound, RunState.LOST.value), else_=RunState.PENDING.value),
        "error": case((at_bound, given_up), else_=runs.c.error),
        "finished_at": case((at_bound, func.now()), else_=runs.c.finished_at),
        "recovery_sends": runs.c.recovery_sends + case((at_bound, 0), else_=1),
    }


def _consumer_from_row(row: Row[Any]) -> UnrecordedConsumer:
    return UnrecordedConsumer(
        queue=row.queue,
        consumer=row.consumer,
        first_seen_at=row.first_seen_at,
        seen_at=row.seen_at,
        gone_at=row.gone_at,
    )
