"""Run statistics over a window that ends at the database's now: how many runs, in
which state, and how late they were handed to the broker, bucket by bucket.

A run belongs where it belongs in history: at its fire time, or at its claim time
for a run without one (sent with ``delay()``). Its state is the current one.

No index of the run table is ordered by that time (one would cost every claim's
insert), so the window is found through the indexes there are:

- finished runs through the retention index, ordered by ``coalesce(finished_at,
  claimed_at)``. A run finishes after it is claimed, and is claimed at most
  ``habeat_claim_ahead`` (30 s at most) before its fire time, so every finished
  run of the window finished after its start less ``FINISHED_MARGIN``: the scan
  starts there, and the runs that fired earlier but finished in the window (long
  tasks, backfills) are filtered out;
- runs not finished through the partial index of active runs: few by nature;
- with a schedule, its runs through the history index on ``(schedule_name, fire_at)``.

Percentiles are PostgreSQL's ``percentile_cont``: linear interpolation between the
nearest ranks (Python's ``statistics.quantiles(..., method="inclusive")``).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import (
    ColumnElement,
    Double,
    Select,
    Subquery,
    TextClause,
    bindparam,
    func,
    literal,
    select,
    text,
    union_all,
)
from sqlalchemy.dialects.postgresql import ARRAY

from beat.db import StoreConnection
from beat.models import RunState
from beat.run_store import lateness_seconds
from beat.tables import ACTIVE_SQL, FINISHED_SQL, TZ, runs

#: The narrowest bucket: a shorter window gets fewer buckets.
MIN_BUCKET = timedelta(minutes=1)
#: How long before its fire time a run may be claimed (``habeat_claim_ahead`` is at
#: most 30 s), with room to spare: how far before the window the scan of the
#: finished runs starts.
FINISHED_MARGIN = timedelta(minutes=1)
#: The percentiles of lateness reported, as fractions.
QUANTILES = (0.5, 0.95, 0.99)


@dataclass(frozen=True, kw_only=True, slots=True)
class Percentiles:
    """Lateness in seconds (``published_at - fire_at``) of published runs."""

    p50: float
    p95: float
    p99: float
    max: float


@dataclass(frozen=True, kw_only=True, slots=True)
class StatsBucket:
    """The runs of one bucket of the window: those whose time is from ``start`` to the
    next bucket's start (the last one's end is the window's, now)."""

    start: datetime
    #: Runs by their current state; every state is a key.
    counts: dict[RunState, int]
    #: Over the bucket's published runs; None when none was published.
    lateness: Percentiles | None

    @property
    def total(self) -> int:
        return sum(self.counts.values())


@dataclass(frozen=True, kw_only=True, slots=True)
class RunStats:
    """Runs of the ``window`` ending at ``now`` (the database's), in equal buckets."""

    window: timedelta
    #: Width of every bucket (the window divided by their number).
    bucket: timedelta
    now: datetime
    #: Oldest first; the first starts at ``now - window``.
    buckets: list[StatsBucket]
    #: Over the whole window.
    total_counts: dict[RunState, int]
    lateness: Percentiles | None

    @property
    def start(self) -> datetime:
        return self.now - self.window

    def per_minute(self, count: int) -> float:
        """A count of runs of one bucket as runs per minute."""
        return count / (self.bucket / timedelta(minutes=1))

    def runs_per_minute(self) -> list[float]:
        """Runs per minute of every bucket (all states), oldest first."""
        return [self.per_minute(bucket.total) for bucket in self.buckets]


def bucket_starts(
    now: datetime, window: timedelta, buckets: int
) -> tuple[timedelta, list[datetime]]:
    """The width of the buckets and where each starts: ``buckets`` of them, fewer when
    they would be narrower than ``MIN_BUCKET``."""
    count = max(1, min(buckets, window // MIN_BUCKET))
    width = window / count
    start = now - window
    return width, [start + index * width for index in range(count)]


class RunStatsStore(StoreConnection):
    """Reads the statistics of the run table (see the module docstring)."""

    def stats(self, window: timedelta, *, buckets: int, schedule: str | None = None) -> RunStats:
        """The runs of ``window`` up to now in ``buckets`` buckets (see
        :func:`bucket_starts`), of one schedule or of all; one statement."""
        with self._transaction() as conn:
            now: datetime = conn.execute(select(func.now())).scalar_one()
            width, starts = bucket_starts(now, window, buckets)
            rows = conn.execute(
                _stats_query(schedule), {"start": starts[0], "now": now, "starts": starts}
            ).all()
        by_bucket = {row.bucket: row for row in rows if not row.whole}
        whole = next((row for row in rows if row.whole), None)
        return RunStats(
            window=window,
            bucket=width,
            now=now,
            buckets=[
                StatsBucket(
                    start=start,
                    counts=_counts(by_bucket.get(index + 1)),
                    lateness=_percentiles(by_bucket.get(index + 1)),
                )
                for index, start in enumerate(starts)
            ],
            total_counts=_counts(whole),
            lateness=_percentiles(whole),
        )


def _stats_query(schedule: str | None) -> Select[Any]:
    """Counts by state and lateness percentiles per bucket (``width_bucket`` over the
    bucket starts: exact, and the same bounds as the Python side), and over the whole
    window (``ROLLUP``'s grand total, told apart by ``GROUPING``)."""
    window = _window_runs(schedule)
    bucket = func.width_bucket(window.c.at, bindparam("starts", type_=ARRAY(TZ)))
    counts = [
        func.count().filter(window.c.state == literal(state.value)).label(state.value)
        for state in RunState
    ]
    quantiles = literal(list(QUANTILES), ARRAY(Double))
    return select(
        bucket.label("bucket"),
        (func.grouping(bucket) == 1).label("whole"),
        *counts,
        func.percentile_cont(quantiles).within_group(window.c.lateness).label("quantiles"),
        func.max(window.c.lateness).label("slowest"),
    ).group_by(func.rollup(bucket))


def _window_runs(schedule: str | None) -> Subquery:
    """The runs whose time is in ``:start`` .. ``:now`` (see the module docstring for
    the index each part uses): their time, state and lateness."""
    at = func.coalesce(runs.c.fire_at, runs.c.claimed_at)
    lateness = lateness_seconds()
    start, now = bindparam("start", type_=TZ), bindparam("now", type_=TZ)

    def part(*conditions: ColumnElement[bool] | TextClause) -> Select[Any]:
        return select(at.label("at"), runs.c.state, lateness.label("lateness")).where(*conditions)

    if schedule is not None:
        named = runs.c.schedule_name == schedule
        parts = [
            part(named, runs.c.fire_at.between(start, now)),
            part(named, runs.c.fire_at.is_(None), runs.c.claimed_at.between(start, now)),
        ]
    else:
        in_window = at.between(start, now)
        finished_since = func.coalesce(runs.c.finished_at, runs.c.claimed_at) >= (
            start - FINISHED_MARGIN
        )
        # The indexes' predicates as literal SQL: a bound parameter would keep a
        # generic plan from using the partial indexes.
        parts = [
            part(text(FINISHED_SQL), finished_since, in_window),
            part(text(ACTIVE_SQL), in_window),
        ]
    return union_all(*parts).subquery("window_runs")


def _counts(row: Any) -> dict[RunState, int]:
    return {state: 0 if row is None else getattr(row, state.value) for state in RunState}


def _percentiles(row: Any) -> Percentiles | None:
    if row is None or row.slowest is None:
        return None
    p50, p95, p99 = row.quantiles
    return Percentiles(p50=p50, p95=p95, p99=p99, max=row.slowest)
