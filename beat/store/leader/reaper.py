"""The reaper (``reclaim``): runs whose worker died or whose message is presumed gone
back to the outbox, or ended ``lost`` once their attempts or sends are spent."""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Sequence
from typing import Any

from sqlalchemy import (
    Connection,
    Row,
    and_,
    any_,
    bindparam,
    case,
    func,
    literal,
    or_,
    select,
    update,
)
from sqlalchemy.dialects.postgresql import ARRAY, UUID

from beat.models import PLAIN_RUN_INTERRUPTED, RunState, RunToPublish
from beat.store.leader.base import FencedStore, _run_from_row
from beat.store.leader.lost_messages import MAX_SENDS, _sent_again_or_lost
from beat.store.leader.records import InQueue, LostRun, Reclaim
from beat.store.rows import due_again
from beat.store.tables import runs, workers
from beat.store.workflow_steps import end_stalled_workflows, has_no_recorded_step

#: Attempts ended by their worker's death that a run may have before it is given up
#: (a job that kills the whole worker process every time must not loop for ever).
MAX_INTERRUPTIONS = 10


class ReaperStatements(FencedStore):
    """The reaper, fenced like a claim."""

    def reclaim(
        self,
        epoch: int,
        *,
        stale_queued_after: float,
        limit: int,
        idle_timeout: float = 10.0,
        lease_seconds: float = 30.0,
        dead: Sequence[uuid.UUID] = (),
        interrupted: Sequence[uuid.UUID] = (),
        in_queue: InQueue | None = None,
    ) -> Reclaim:
        """The reaper, as leader ``epoch`` (fenced like a claim), in one transaction:

        - a ``running`` run whose lease expired (its worker died or was cut off),
          or whose worker process is known dead (``dead``: its beacon is gone,
          ``beat.lease.beacon``; ``interrupted`` if its whole worker died with it),
          goes back to the outbox (``pending``, attempt kept) to be published
          again under the same task ID, unless it has had ``max_attempts``
          attempts (Celery retries not counted): then it is ``lost``. An attempt
          whose worker process is known to have died (``beat_workers``: not seen
          since, or started again) is an interruption, not the run's fault: it
          does not count, up to ``MAX_INTERRUPTIONS``;
        - a ``queued`` or ``retrying`` run whose message a worker took (receipt
          lease, see ``beat.delivery.tracking``) but which that worker never started,
          the lease having expired, goes back to the outbox (a retry at its time,
          the times of the deliveries before it cleared);
        - a ``queued`` run no worker holds, published more than
          ``stale_queued_after`` seconds ago (twice the visibility timeout: its
          message is presumed gone from the broker) goes back to the outbox too,
          counted like a copy of lost-message recovery (``_sent_again_or_lost``):
          once its message was sent ``MAX_SENDS`` times it ends ``lost`` with the
          reason. A consumer that records nothing (``beat.leader.lost_messages``) runs
          every copy it takes, so the rule must be bounded: without the bound such
          a run would be executed once more every ``stale_queued_after``, for ever.
          ``in_queue`` (the broker's content, where it can be read: Redis) tells
          which of these runs still have their message waiting in a queue: those
          wait in a backlog, and are neither sent again nor counted. Where nothing
          can be read (RabbitMQ, a topic or fanout route, Redis unreachable) every
          such run counts: a run left waiting in a backlog of more than three
          times ``stale_queued_after`` (six times the visibility timeout, 6 hours by
          default) gets two copies behind it and then ends ``lost``, and its
          messages are refused when they come (a gap, never a second execution).
        - a workflow run that can no longer end by itself (none of its steps waits or
          runs, and none moved for ``stale_queued_after``: the step after the last one
          that ended was never sent) ends ``lost`` (``end_stalled_workflows``).
          That is the trade a production fleet wants: a backlog that deep is an
          outage already, and a consumer that records nothing must not run one
          run without end.
        """
        expired = (
            select(runs.c.id)
            .where(
                runs.c.state == RunState.RUNNING.value,
                or_(runs.c.lease_expires_at < func.now(), runs.c.id.in_(list(dead))),
            )
            .order_by(runs.c.lease_expires_at)
            .limit(limit)
            .with_for_update(skip_locked=True)
            .cte("expired")
        )
        # A plain task is never started twice: once its worker is gone after it started,
        # the run is over. (Taken but not started, it is published again like any run.)
        interrupted_plain = and_(runs.c.plain, runs.c.started_at.is_not(None))
        # The heuristic on beat_workers reads a run whose lease expired; a run taken back
        # before that (its process is dead) was interrupted only if its whole worker died.
        lease_expired = runs.c.lease_expires_at < func.now()
        worker_died = or_(
            and_(lease_expired, _worker_died(lease_seconds)), runs.c.id.in_(list(interrupted))
        )
        interruptions = runs.c.interruptions + case((worker_died, 1), else_=0)
        exhausted = or_(
            interrupted_plain,
            runs.c.attempt - runs.c.retries - interruptions >= runs.c.max_attempts,
            interruptions > MAX_INTERRUPTIONS,
        )
        lost_error = case(
            (
                interrupted_plain,
                func.concat(PLAIN_RUN_INTERRUPTED, " (worker ", runs.c.worker, ")"),
            ),
            (
                interruptions > MAX_INTERRUPTIONS,
                func.concat(
                    "its worker died ",
                    interruptions,
                    " times while running it (last ",
                    func.coalesce(runs.c.worker, "?"),
                    "): given up",
                ),
            ),
            else_=func.concat(
                "lease expired on attempt ",
                runs.c.attempt,
                " of ",
                runs.c.max_attempts,
                " (worker ",
                func.coalesce(runs.c.worker, "?"),
                "): attempts exhausted",
            ),
        )
        # A plain run's retry is held by the worker that received it (``running``, not
        # started) until its countdown ends: sent again, it keeps its due time. A retry
        # whose time had come (its worker died running it) is due again at that time,
        # later than the delivery before it was published.
        due_later = and_(
            ~exhausted,
            or_(runs.c.retry_due_at > func.now(), due_again() > runs.c.published_at),
        )
        reap = (
            update(runs)
            .where(runs.c.id == expired.c.id)
            .values(
                state=case((exhausted, RunState.LOST.value), else_=RunState.PENDING.value),
                error=case((exhausted, lost_error), else_=runs.c.error),
                interruptions=interruptions,
                finished_at=case((exhausted, func.now()), else_=None),
                epoch=epoch,
                claimed_at=func.now(),
                lease_owner=None,
                lease_expires_at=None,
                # A run that ends here is not sent again: its not_before stays.
                not_before=case((exhausted, runs.c.not_before), else_=due_again()),
                # As below: a delivery due later keeps no time of the ones before it.
                published_at=case((due_later, None), else_=runs.c.published_at),
                received_at=case((due_later, None), else_=runs.c.received_at),
                started_at=case((due_later, None), else_=runs.c.started_at),
            )
            .returning(*runs.c, func.now().label("now"))
        )
        # A worker took the message but died before starting it (a reserved message, a
        # retry waiting for its countdown): kombu would restore it only after the
        # visibility timeout. Back to the outbox, at its retry time if that is later.
        held_by_dead = (
            update(runs)
            .where(
                runs.c.state.in_([RunState.QUEUED.value, RunState.RETRYING.value]),
                runs.c.lease_expires_at < func.now(),
            )
            .values(
                state=RunState.PENDING.value,
                epoch=epoch,
                claimed_at=func.now(),
                lease_owner=None,
                lease_expires_at=None,
                # A retry is not published before it is due (the outbox waits for it).
                not_before=due_again(),
                # The run waits for a new delivery, due at that later time: the times of
                # the deliveries before it (a publication and an attempt on time for the
                # fire time, the receipt of a retry's message held for its countdown) are
                # cleared, else the row pairs them with the retry's due time and reads as
                # sent early. They are written again by this delivery: published_at by
                # mark_published, or, if that is lost (PostgreSQL down just after the
                # send), by the worker that takes the message (coalesce), never before it.
                published_at=None,
                received_at=None,
                started_at=None,
            )
            .returning(*runs.c, func.now().label("now"))
        )
        with self._transaction() as conn:
            self._fence(conn, epoch, idle_timeout)
            rows = [*_due(conn.execute(reap))]
            rows += _send_stale_again(conn, epoch, stale_queued_after, limit, in_queue)
            rows += _due(conn.execute(held_by_dead))
            rows += end_stalled_workflows(conn, stale_queued_after)
        republish = [_run_from_row(row) for row in rows if row.state == RunState.PENDING.value]
        lost = [
            LostRun(id=row.id, schedule_name=row.schedule_name, error=row.error)
            for row in rows
            if row.state == RunState.LOST.value
        ]
        return Reclaim(runs=republish, lost=lost)

    def links_left_unsent(
        self, epoch: int, *, older_than: float, limit: int, idle_timeout: float = 10.0
    ) -> list[RunToPublish]:
        """Workflow steps that succeeded ``older_than`` seconds ago or more and whose
        links (the steps after them) or count in a chord are still not done: their
        worker died before it sent them, and their message, which a second delivery
        would have sent them from, is gone (a Redis restart). Their message is sent
        again: the worker that takes it finds the step succeeded and does what was left
        (``beat.delivery.links``), under the same task IDs. At most ``MAX_SENDS`` copies
        a step (``recovery_sends``)."""
        left = (
            select(runs.c.id)
            .where(
                runs.c.workflow_run_id.is_not(None),
                runs.c.state == RunState.SUCCEEDED.value,
                runs.c.unsent_links.is_not(None),
                runs.c.finished_at < func.now() - func.make_interval(0, 0, 0, 0, 0, 0, older_than),
                runs.c.recovery_sends < MAX_SENDS,
            )
            .limit(limit)
            .with_for_update(skip_locked=True)
            .cte("left")
        )
        again = (
            update(runs)
            .where(runs.c.id == left.c.id)
            # Sent again now: a workflow it holds up is not stalled yet.
            .values(recovery_sends=runs.c.recovery_sends + 1, epoch=epoch, published_at=func.now())
            .returning(*runs.c)
        )
        with self._transaction() as conn:
            self._fence(conn, epoch, idle_timeout)
            return [_run_from_row(row) for row in conn.execute(again)]


def _due(rows: Iterable[Row[Any]]) -> list[Row[Any]]:
    """The rows put back in the outbox that are due now; the outbox sends the others
    when their ``not_before`` comes."""
    return [row for row in rows if row.not_before is None or row.not_before <= row.now]


def _send_stale_again(
    conn: Connection, epoch: int, older_than: float, limit: int, in_queue: InQueue | None
) -> list[Row[Any]]:
    """The reaper's visibility-timeout rule (``LeaderStore.reclaim``): the ``queued`` runs
    no worker holds, published more than ``older_than`` seconds ago, locked, back to the
    outbox or ``lost`` at the bound; those whose message ``in_queue`` finds waiting in
    a queue are left as they are. The rows are locked while the broker is read: a worker
    taking one of these messages meanwhile records its receipt after this decision."""
    stale = list(
        conn.execute(
            select(*runs.c)
            .where(
                runs.c.state == RunState.QUEUED.value,
                # A worker holds it (receipt lease): if that worker dies, held_by_dead acts.
                runs.c.lease_owner.is_(None),
                runs.c.published_at < func.now() - func.make_interval(0, 0, 0, 0, 0, 0, older_than),
                # A workflow whose steps are recorded: its steps are sent again, not it.
                has_no_recorded_step(),
            )
            .order_by(runs.c.published_at)
            .limit(limit)
            .with_for_update(skip_locked=True)
        )
    )
    waiting = set(in_queue([_run_from_row(row) for row in stale])) if stale and in_queue else set()
    copies = [row.id for row in stale if row.id not in waiting]
    if not copies:
        return []
    return list(
        conn.execute(
            update(runs)
            .where(runs.c.id == any_(bindparam("ids", type_=ARRAY(UUID(as_uuid=True)))))
            .values(**_sent_again_or_lost(MAX_SENDS), epoch=epoch, claimed_at=func.now())
            .returning(*runs.c),
            {"ids": copies},
        )
    )


def _worker_died(lease_seconds: float) -> Any:
    """Is the worker process that held a run whose lease expired known to be dead?

    Its worker renews ``beat_workers`` every third of the lease, from its main
    process: alive, it was seen less than a third of the lease before now, so
    after the run's lease expired, or just before. Dead, it was last seen about
    when the run's last heartbeat was, a whole lease before the expiry. Half a
    lease tells the two apart. A worker started again since the run started is
    another process: the one that ran it died (both instants by the database's
    clock: a worker records its start as PostgreSQL's time less its uptime,
    ``beat.delivery.tracking.WorkerHeartbeat``). A worker with no row (it does not
    import ``beat.delivery.tracking``) cannot be judged: the attempt counts."""
    half_lease = func.make_interval(0, 0, 0, 0, 0, 0, lease_seconds / 2)
    return (
        select(literal(1))
        .where(
            workers.c.name == runs.c.worker,
            or_(
                workers.c.seen_at < runs.c.lease_expires_at - half_lease,
                workers.c.booted_at > runs.c.started_at,
            ),
        )
        .exists()
    )
