"""Retention: old finished runs deleted in batches, and the run statistics' minutes
summarised before they go; with the same cutoff, the incidents resolved and the
notifications sent or given up before it, and the audit log's changes made before it."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import delete, func, select, text

from beat.store.leader.base import FencedStore
from beat.store.leader.records import PruneReport
from beat.store.rows import finished_age
from beat.store.schedule_outcomes import delete_runs_keeping_outcomes
from beat.store.stats import RunStatsStore, SummaryReport
from beat.store.tables import (
    FINISHED_SQL,
    idempotency_keys,
    incidents,
    notifications,
    runs,
    schedule_changes,
)

#: At most this many incidents are deleted per transaction, whatever the batch: each
#: one's notifications are found by ``ix_beat_notifications_incident`` (without it, a
#: scan of the outbox each: a thousand incidents took 5.5 s at 75,000 notifications;
#: with it, 5,000 and their 15,000 notifications took 0.145 s).
INCIDENTS_PER_BATCH = 500

#: One transaction of a prune: (rows deleted that count against the batch size,
#: rows deleted along with them).
DeleteBatch = Callable[[], tuple[int, int]]


class RetentionStatements(FencedStore):
    """Pruning finished runs, settled notifications and resolved incidents, and
    summarising finished runs."""

    def prune(
        self,
        older_than: timedelta,
        *,
        batch: int = 1000,
        on_batch: Callable[[int], None] | None = None,
        budget: float | None = None,
    ) -> PruneReport:
        """Delete finished runs whose ``finished_at`` (else ``claimed_at``) is older
        than ``older_than``, ``batch`` rows per transaction, so no lock is held long;
        with the same cutoff, the notifications sent or given up before it, and the
        incidents resolved before it with their notifications (``INCIDENTS_PER_BATCH``
        at most per transaction). Never an open incident, nor a notification still to
        be sent, nor the incident of one (deleting the incident would delete its
        notifications).

        The cutoff is fixed once, at the start. Rows locked by someone else are
        skipped (they are not finished business for long). ``on_batch`` gets the
        row count of every transaction that deleted runs. ``budget`` bounds the
        seconds one call spends (the leader prunes on each maintenance pass): no
        batch starts after it is spent, but one of runs, one of notifications and one
        of incidents always run, so that a backlog of runs never holds the incidents
        back; the report says whether old rows are left.
        """
        if batch < 1:
            raise ValueError(f"batch={batch!r}: must be at least 1")
        with self._transaction() as conn:
            cutoff: datetime = conn.execute(select(func.now() - older_than)).scalar_one()
            # The summary of the minutes whose runs go (``beat.store.stats``) goes too.
            self._run_stats().delete_summary_before(cutoff, conn)
        deadline = None if budget is None else time.monotonic() + budget
        finished = _in_batches(
            lambda: (self._prune_batch(cutoff, batch), 0), batch, deadline, on_batch
        )
        settled = _in_batches(
            lambda: (self._prune_notifications_batch(cutoff, batch), 0), batch, deadline
        )
        per_batch = min(batch, INCIDENTS_PER_BATCH)
        resolved = _in_batches(
            lambda: self._prune_incidents_batch(cutoff, per_batch), per_batch, deadline
        )
        audited = _in_batches(
            lambda: (self._prune_changes_batch(cutoff, batch), 0), batch, deadline
        )
        keys = _in_batches(lambda: (self._prune_keys_batch(cutoff, batch), 0), batch, deadline)
        return PruneReport(
            deleted=finished.rows,
            batches=finished.batches,
            cutoff=cutoff,
            caught_up=all(part.caught_up for part in (finished, settled, resolved, audited, keys)),
            incidents=resolved.rows,
            notifications=settled.rows + resolved.along,
            changes=audited.rows,
        )

    def summarise(
        self, *, until: datetime | None = None, budget: float | None = None
    ) -> SummaryReport:
        """Summarise the settled minutes of finished runs for the run statistics
        (:meth:`beat.store.stats.RunStatsStore.summarise`). Not fenced: the summary
        is derived from committed runs, and its own row lock keeps two processes
        from summarising a minute twice."""
        return self._run_stats().summarise(until=until, budget=budget)

    def _run_stats(self) -> RunStatsStore:
        return RunStatsStore(self.engine, setting=self.setting)

    def _prune_batch(self, cutoff: datetime, batch: int) -> int:
        age = finished_age()
        doomed = (
            select(runs.c.id)
            # The predicate of the retention index, as literal SQL: a bound parameter
            # would keep a generic plan from using the index.
            .where(text(FINISHED_SQL), age < cutoff)
            .order_by(age)
            .limit(batch)
            .with_for_update(skip_locked=True)
        )
        with self._transaction() as conn:
            return delete_runs_keeping_outcomes(conn, doomed)

    # No index serves the two deletes below: both tables stay small (an incident opens
    # for a streak of failures, not for a run; a notification is one event told to one
    # channel), and once caught up the leader prunes once a minute, so a scan of each is
    # cheap. The cascade of an incident's delete scans the notifications too (see
    # INCIDENTS_PER_BATCH): they go first, so that it scans fewer.

    def _prune_notifications_batch(self, cutoff: datetime, batch: int) -> int:
        """Delete up to ``batch`` notifications sent or given up before ``cutoff``."""
        # NULL while still to be sent: GREATEST passes over one NULL, not over two.
        settled_at = func.greatest(notifications.c.sent_at, notifications.c.given_up_at)
        doomed = (
            select(notifications.c.id)
            .where(settled_at < cutoff)
            .order_by(settled_at)
            .limit(batch)
            .with_for_update(skip_locked=True)
        )
        with self._transaction() as conn:
            return conn.execute(
                delete(notifications).where(notifications.c.id.in_(doomed))
            ).rowcount

    def _prune_changes_batch(self, cutoff: datetime, batch: int) -> int:
        """Delete up to ``batch`` changes of the audit log made before ``cutoff``."""
        doomed = (
            select(schedule_changes.c.id)
            .where(schedule_changes.c.changed_at < cutoff)
            .order_by(schedule_changes.c.changed_at)
            .limit(batch)
            .with_for_update(skip_locked=True)
        )
        with self._transaction() as conn:
            return conn.execute(
                delete(schedule_changes).where(schedule_changes.c.id.in_(doomed))
            ).rowcount

    def _prune_keys_batch(self, cutoff: datetime, batch: int) -> int:
        """Delete up to ``batch`` idempotency keys of creates made before ``cutoff``."""
        doomed = (
            select(idempotency_keys.c.key)
            .where(idempotency_keys.c.created_at < cutoff)
            .limit(batch)
            .with_for_update(skip_locked=True)
        )
        with self._transaction() as conn:
            return conn.execute(
                delete(idempotency_keys).where(idempotency_keys.c.key.in_(doomed))
            ).rowcount

    def _prune_incidents_batch(self, cutoff: datetime, batch: int) -> tuple[int, int]:
        """Delete up to ``batch`` incidents resolved before ``cutoff`` that have no
        notification still to be sent, with their notifications: (incidents,
        notifications) deleted."""
        pending = select(notifications.c.id).where(
            notifications.c.incident_id == incidents.c.id,
            # The predicate of the outbox's index, whose rows are the few pending ones.
            notifications.c.sent_at.is_(None),
            notifications.c.given_up_at.is_(None),
        )
        # A resolved incident gets no new notification (and one added meanwhile would
        # wait for the lock taken here, then find the incident gone): none pending now
        # is none pending when it goes.
        doomed = (
            select(incidents.c.id)
            .where(incidents.c.resolved_at < cutoff, ~pending.exists())
            .order_by(incidents.c.resolved_at)
            .limit(batch)
            .with_for_update(skip_locked=True)
        )
        with self._transaction() as conn:
            gone = list(conn.execute(doomed).scalars())
            if not gone:
                return 0, 0
            # Deleted here rather than by the cascade, to be counted.
            told = conn.execute(
                delete(notifications).where(notifications.c.incident_id.in_(gone))
            ).rowcount
            conn.execute(delete(incidents).where(incidents.c.id.in_(gone)))
        return len(gone), told


@dataclass(slots=True)
class _Deleted:
    rows: int = 0
    #: Rows deleted along with those (the notifications of the incidents deleted).
    along: int = 0
    #: Transactions that deleted at least one row.
    batches: int = 0
    caught_up: bool = False


def _in_batches(
    delete_batch: DeleteBatch,
    batch: int,
    deadline: float | None,
    on_batch: Callable[[int], None] | None = None,
) -> _Deleted:
    """Run ``delete_batch`` until it deletes fewer than ``batch`` rows, or until
    ``deadline`` (``time.monotonic()``) has passed: it runs once whatever the time."""
    deleted = _Deleted()
    while True:
        count, along = delete_batch()
        if count:
            deleted.rows, deleted.along = deleted.rows + count, deleted.along + along
            deleted.batches += 1
            if on_batch is not None:
                on_batch(count)
        if count < batch:
            deleted.caught_up = True
            return deleted
        if deadline is not None and time.monotonic() >= deadline:
            return deleted
