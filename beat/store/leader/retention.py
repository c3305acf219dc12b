"""Retention: old finished runs deleted in batches, and the run statistics' minutes
summarised before they go."""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import datetime, timedelta

from sqlalchemy import func, select, text

from beat.store.leader.base import FencedStore
from beat.store.leader.records import PruneReport
from beat.store.rows import finished_age
from beat.store.schedule_outcomes import delete_runs_keeping_outcomes
from beat.store.stats import RunStatsStore, SummaryReport
from beat.store.tables import FINISHED_SQL, runs


class RetentionStatements(FencedStore):
    """Pruning and summarising finished runs."""

    def prune(
        self,
        older_than: timedelta,
        *,
        batch: int = 1000,
        on_batch: Callable[[int], None] | None = None,
        budget: float | None = None,
    ) -> PruneReport:
        """Delete finished runs whose ``finished_at`` (else ``claimed_at``) is older
        than ``older_than``, ``batch`` rows per transaction, so no lock is held long.

        The cutoff is fixed once, at the start. Rows locked by someone else are
        skipped (they are not finished business for long). ``on_batch`` gets the
        row count of every transaction that deleted something. ``budget`` bounds
        the seconds one call spends (the leader prunes on each maintenance pass):
        no batch starts after it is spent, but one always runs; the report says
        whether old runs are left.
        """
        if batch < 1:
            raise ValueError(f"batch={batch!r}: must be at least 1")
        with self._transaction() as conn:
            cutoff: datetime = conn.execute(select(func.now() - older_than)).scalar_one()
            # The summary of the minutes whose runs go (``beat.store.stats``) goes too.
            self._run_stats().delete_summary_before(cutoff, conn)
        deadline = None if budget is None else time.monotonic() + budget
        deleted = batches = 0
        while True:
            count = self._prune_batch(cutoff, batch)
            if count:
                deleted, batches = deleted + count, batches + 1
                if on_batch is not None:
                    on_batch(count)
            caught_up = count < batch
            if caught_up or (deadline is not None and time.monotonic() >= deadline):
                return PruneReport(
                    deleted=deleted, batches=batches, cutoff=cutoff, caught_up=caught_up
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
