"""What operators read about the cluster: queues whose runs no worker takes, the
workers alive, and each schedule's series for Prometheus."""

from __future__ import annotations

from datetime import datetime, timedelta

from sqlalchemy import func, select, text

from beat.publish.dispatch import ROUTING_OPTIONS
from beat.store.leader.base import FencedStore
from beat.store.leader.records import QueueBacklog, QueueOf, WorkerPresence
from beat.store.schedule_series import ScheduleSeries, ScheduleSeriesReads
from beat.store.tables import runs, workers


class ClusterReads(FencedStore):
    """The backlog by queue and the live workers."""

    def queued_backlog(self, *, older_than: timedelta, queue_of: QueueOf) -> list[QueueBacklog]:
        """Queues holding runs published more than ``older_than`` ago that no worker has
        received, the most stuck first. Runs are grouped by task and routing options in
        PostgreSQL (on the index of queued runs), and each group's queue is worked out
        once by ``queue_of``, as the publisher routed it."""
        waiting = (
            select(
                runs.c.task,
                runs.c.published_at,
                *(runs.c.options[key].astext.label(key) for key in ROUTING_OPTIONS),
            )
            # The index's predicate, as literal SQL: a bound parameter would keep a
            # generic plan from using it.
            .where(text("state = 'queued'"))
            .where(
                runs.c.published_at
                < func.now() - func.make_interval(0, 0, 0, 0, 0, 0, older_than.total_seconds()),
                runs.c.received_at.is_(None),
            )
            .subquery("waiting")
        )
        routing = [waiting.c[key] for key in ROUTING_OPTIONS]
        query = select(
            waiting.c.task,
            *routing,
            func.count().label("runs"),
            func.min(waiting.c.published_at).label("oldest"),
        ).group_by(waiting.c.task, *routing)
        with self._transaction() as conn:
            groups = list(conn.execute(query))
        by_queue: dict[str, QueueBacklog] = {}
        for row in groups:
            options = {key: row._mapping[key] for key in ROUTING_OPTIONS if row._mapping[key]}
            queue = queue_of(row.task, options)
            by_queue[queue] = _merged_backlog(by_queue.get(queue), queue, row.runs, row.oldest)
        return sorted(by_queue.values(), key=lambda b: (b.oldest_published_at, b.queue))

    def schedule_series(self, *, limit: int) -> list[ScheduleSeries] | None:
        """Each schedule's series for Prometheus; None past ``limit`` schedules
        (:mod:`beat.store.schedule_series`). Reads only: not fenced."""
        return ScheduleSeriesReads(self.engine, setting=self.setting).schedule_series(limit=limit)

    def live_workers(self, *, within: timedelta) -> list[WorkerPresence]:
        """The workers that renewed their row less than ``within`` ago (a worker does it
        every third of its lease), by name."""
        query = (
            select(workers.c.name, workers.c.pid, workers.c.booted_at, workers.c.seen_at)
            .where(
                workers.c.seen_at
                >= func.now() - func.make_interval(0, 0, 0, 0, 0, 0, within.total_seconds())
            )
            .order_by(workers.c.name)
        )
        with self._transaction() as conn:
            return [
                WorkerPresence(
                    name=row.name, pid=row.pid, booted_at=row.booted_at, seen_at=row.seen_at
                )
                for row in conn.execute(query)
            ]


def _merged_backlog(
    known: QueueBacklog | None, queue: str, waiting: int, oldest: datetime
) -> QueueBacklog:
    """``known`` (None: none yet) with a group of ``waiting`` runs more."""
    if known is None:
        return QueueBacklog(queue=queue, waiting=waiting, oldest_published_at=oldest)
    return QueueBacklog(
        queue=queue,
        waiting=known.waiting + waiting,
        oldest_published_at=min(known.oldest_published_at, oldest),
    )
