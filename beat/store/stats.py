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

The summary of finished runs
----------------------------

Reading every run of a long window costs about a microsecond a run (seconds for a
day of a busy cluster), so the leader summarises finished runs minute by minute
(:meth:`RunStatsStore.summarise`) into ``beat_run_minutes``: one row per minute and
state, keyed by the minute the run *finished* (``coalesce(finished_at,
claimed_at)``, the key of the retention index, which the summariser reads in order,
each run once). ``beat_run_summary.summarised_until`` says how far it has gone.

The statistics of all schedules then read, in one snapshot:

- the summary for the minutes before ``summarised_until``: a minute's runs count in
  the bucket where the minute starts (the minute holding the window's start counts
  in the first bucket), so there a run is placed at the minute it finished, not at
  its fire time: the difference is the run's duration (plus its lateness);
- the finished runs from ``summarised_until`` on, and the runs not finished, live as
  above (by fire time). Each finished run is on one side of ``summarised_until``:
  none is counted twice or missed at the seam.

The summary is kept by block of ten minutes too (``beat_run_blocks``, by triggers on
``beat_run_minutes``, migration 0024): a block whose ten minutes lie in one bucket, and
that no delete or update of its minutes broke, is read as one row; every other minute
as its own (:func:`_summary_query`).

The live runs are counted in SQL by bucket, state and lateness bin as the summary
bins them (a few hundred rows, whatever the runs), so every percentile is read from
merged histograms (``LATENESS_BINS``, ``Percentiles.approximate``): each value taken
at the middle of its bin, within 9 % of the true one (0.5 ms below 1 ms); the maximum
stays exact. Without a summary yet (no leader has made one), every run is read live
and the percentiles are exact.
With ``schedule``, everything is read live and exact (a schedule's runs are few).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import (
    ColumnElement,
    Connection,
    Double,
    Select,
    Subquery,
    Table,
    TextClause,
    and_,
    bindparam,
    column,
    func,
    literal,
    select,
    text,
    union_all,
)
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.dialects.postgresql import insert as pg_insert

from beat.models import RunState
from beat.store.db import StoreConnection, plan_without_jit, sort_in_memory
from beat.store.minute_summary import SETTLE as SETTLE
from beat.store.minute_summary import summarise_batch
from beat.store.percentiles import (
    LATENESS_BINS,
    QUANTILES,
    Percentiles,
    histogram_percentiles,
    lateness_bin,
)
from beat.store.rows import finished_age, lateness_seconds
from beat.store.tables import (
    ACTIVE_SQL,
    FINISHED_SQL,
    TZ,
    run_blocks,
    run_minutes,
    run_summary,
    runs,
)

#: The narrowest bucket: a shorter window gets fewer buckets.
MIN_BUCKET = timedelta(minutes=1)
#: How long before its fire time a run may be claimed (``habeat_claim_ahead`` is at
#: most 30 s), with room to spare: how far before the window the scan of the
#: finished runs starts.
FINISHED_MARGIN = timedelta(minutes=1)
#: Minutes summarised per transaction (at most).
SUMMARY_BATCH = timedelta(hours=1)


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
    #: Finished runs before this were read from the summary (by the minute they
    #: finished); None: all were read live (see the module docstring).
    summarised_until: datetime | None = None

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
    # In UTC: Python adds to a time of a zone with daylight saving in wall-clock time,
    # and the database's session may be in one.
    start = now.astimezone(UTC) - window
    return width, [start + index * width for index in range(count)]


@dataclass(frozen=True, kw_only=True, slots=True)
class SummaryReport:
    """What one call of :meth:`RunStatsStore.summarise` did."""

    #: Finished runs summarised, and the rows of ``beat_run_minutes`` written.
    runs: int
    rows: int
    #: Transactions that moved ``summarised_until``.
    batches: int
    #: Every minute before it is summarised (None: no summary yet, another
    #: process holds it).
    summarised_until: datetime | None
    #: False when the time budget ran out (or another process was summarising)
    #: before the last settled minute.
    caught_up: bool


class RunStatsStore(StoreConnection):
    """Reads the statistics of the run table, and keeps its summary (see the module
    docstring)."""

    def stats(self, window: timedelta, *, buckets: int, schedule: str | None = None) -> RunStats:
        """The runs of ``window`` up to now in ``buckets`` buckets (see
        :func:`bucket_starts`), of one schedule or of all; one snapshot."""
        with self._transaction() as conn:
            if schedule is None:
                # The summary and the live runs must agree on summarised_until.
                conn.execute(text("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ"))
            plan_without_jit(conn)
            sort_in_memory(conn)
            now: datetime = conn.execute(select(func.now())).scalar_one()
            width, starts = bucket_starts(now, window, buckets)
            summarised = None
            if schedule is None:
                summarised = conn.execute(select(run_summary.c.summarised_until)).scalar()
            params = {"start": starts[0], "now": now, "starts": starts, "summarised": summarised}
            if summarised is not None:
                summary = _Summary.read(conn, params)
                summary.add_live(conn.execute(_binned_query(), params))
                return summary.stats(window, width, now, starts, summarised)
            rows = conn.execute(_stats_query(schedule), params).all()
        by_bucket = {row.bucket: row for row in rows if not row.whole}
        whole = next((row for row in rows if row.whole), None)
        return _run_stats(
            window,
            width,
            now,
            starts,
            lambda bucket: (_counts(by_bucket.get(bucket)), _percentiles(by_bucket.get(bucket))),
            whole=(_counts(whole), _percentiles(whole)),
        )

    # -- the summary ----------------------------------------------------------------

    def summarise(
        self,
        *,
        until: datetime | None = None,
        budget: float | None = None,
        batch: timedelta = SUMMARY_BATCH,
    ) -> SummaryReport:
        """Summarise the finished runs of the minutes from ``summarised_until`` up to
        the last settled one (``SETTLE`` before now; before ``until`` if given), at
        most ``batch`` a transaction; the first call starts at the oldest finished run.

        Each transaction locks the row of ``beat_run_summary``, so two processes
        never summarise a minute twice: one that finds it locked returns at once
        (``caught_up`` False) and leaves the work to the other. ``budget`` bounds the
        seconds one call spends (the leader summarises on its maintenance passes): no
        batch starts after it is spent, but one always runs."""
        if batch < MIN_BUCKET:
            raise ValueError(f"batch={batch!r}: must be a minute at least")
        deadline = None if budget is None else time.monotonic() + budget
        self._start_summary()
        summarised_runs = rows = batches = 0
        while True:
            with self._transaction() as conn:
                step = summarise_batch(conn, until, batch)
            if step is None:
                return SummaryReport(
                    runs=summarised_runs,
                    rows=rows,
                    batches=batches,
                    summarised_until=None,
                    caught_up=False,
                )
            summarised_until, caught_up, batch_runs, batch_rows, moved = step
            summarised_runs, rows = summarised_runs + batch_runs, rows + batch_rows
            batches += moved
            if caught_up or (deadline is not None and time.monotonic() >= deadline):
                return SummaryReport(
                    runs=summarised_runs,
                    rows=rows,
                    batches=batches,
                    summarised_until=summarised_until,
                    caught_up=caught_up,
                )

    def _start_summary(self) -> None:
        """The row of ``beat_run_summary``, created at the minute of the oldest finished
        run (the retention index gives it at once) if there is none yet."""
        with self._transaction() as conn:
            if conn.execute(select(run_summary.c.summarised_until)).first() is not None:
                return
            oldest = select(func.min(finished_age())).where(text(FINISHED_SQL)).scalar_subquery()
            first = func.date_trunc("minute", func.coalesce(oldest, func.now() - SETTLE))
            conn.execute(
                pg_insert(run_summary)
                .from_select(["summarised_until"], select(first))
                .on_conflict_do_nothing()
            )

    def delete_summary_before(self, cutoff: datetime, conn: Connection | None = None) -> int:
        """Delete the summary of every minute retention deletes runs of, those that
        begin before ``cutoff``: a minute the cutoff falls in loses its runs before the
        cutoff, and a summary never counts runs that are gone."""
        if conn is not None:
            return _delete_summary_before(conn, cutoff)
        with self._transaction() as own:
            return _delete_summary_before(own, cutoff)


@dataclass(kw_only=True, slots=True)
class _Summary:
    """The summarised minutes of a window, by bucket (1 is the first)."""

    counts: dict[int, dict[RunState, int]] = field(default_factory=dict)
    bins: dict[int, list[int]] = field(default_factory=dict)
    slowest: dict[int, float] = field(default_factory=dict)

    @classmethod
    def read(cls, conn: Connection, params: dict[str, Any]) -> _Summary:
        """Counts by state, merged histograms and maximum lateness by bucket: a
        minute counts in the bucket where it starts (the first for the minute that
        holds the window's start)."""
        summary = cls()
        for bucket, state, count, slowest, *bins in conn.execute(_summary_query(), params):
            summary._count(bucket, state, count)
            if slowest is not None:
                summary._merge(bucket, slowest, enumerate(bins))
        return summary

    def add_live(self, cells: Iterable[Any]) -> None:
        """Add the runs read live, binned in SQL (:func:`_binned_query`)."""
        for bucket, state, bin_, count, slowest in cells:
            self._count(bucket, state, count)
            if bin_ is not None:
                self._merge(bucket, slowest, ((bin_, count),))

    # A plot of a short window adds thousands of cells: these two run for each, so
    # they look their state up in a dict and build no mapping they do not keep.
    def _count(self, bucket: int, state: str, count: int) -> None:
        counts = self.counts.get(bucket)
        if counts is None:
            counts = self.counts[bucket] = _no_runs()
        counts[_STATES[state]] += int(count)

    def _merge(self, bucket: int, slowest: float, cells: Iterable[tuple[int, Any]]) -> None:
        bins = self.bins.get(bucket)
        if bins is None:
            bins = self.bins[bucket] = [0] * LATENESS_BINS
        for index, count in cells:
            if count:
                bins[index] += int(count)
        known = self.slowest.get(bucket)
        self.slowest[bucket] = slowest if known is None else max(known, slowest)

    def stats(
        self,
        window: timedelta,
        width: timedelta,
        now: datetime,
        starts: list[datetime],
        summarised: datetime,
    ) -> RunStats:
        """The statistics of the buckets starting at ``starts``, from what was added."""
        total = _no_runs()
        for counts in self.counts.values():
            total = _add(total, counts)
        whole_bins = [0] * LATENESS_BINS
        for bins in self.bins.values():
            whole_bins = [a + b for a, b in zip(whole_bins, bins, strict=True)]
        slowest = max(self.slowest.values(), default=None)
        return _run_stats(
            window,
            width,
            now,
            starts,
            lambda bucket: (
                self.counts.get(bucket, _no_runs()),
                self._lateness(bucket),
            ),
            whole=(total, None if slowest is None else histogram_percentiles(whole_bins, slowest)),
            summarised=summarised,
        )

    def _lateness(self, bucket: int) -> Percentiles | None:
        bins, slowest = self.bins.get(bucket), self.slowest.get(bucket)
        return None if bins is None or slowest is None else histogram_percentiles(bins, slowest)


#: The width of a block of ``beat_run_blocks`` (migration 0024), and the smallest step
#: of a timestamp (a block's last instant is ``BLOCK - _INSTANT`` after its start).
BLOCK = timedelta(minutes=10)
_INSTANT = timedelta(microseconds=1)


def _delete_summary_before(conn: Connection, cutoff: datetime) -> int:
    deleted = conn.execute(run_minutes.delete().where(run_minutes.c.minute < cutoff)).rowcount
    # The blocks whose every minute is gone (the triggers marked them broken).
    conn.execute(run_blocks.delete().where(run_blocks.c.block <= cutoff.astimezone(UTC) - BLOCK))
    return deleted


@functools.cache
def _summary_query() -> Select[Any]:
    """The summary of the window by bucket and state: runs, the slowest, and the
    histograms summed bin by bin in one pass (a sum per bin: at 10,000 minutes, a third
    of the time of unnesting them). A block whose ten minutes are in the window, before
    ``:summarised`` and in one bucket is read as one row; every other minute as its own
    (a bucket's runs are those of its minutes either way). Built once: ninety sums take
    milliseconds to build, more than the read of a short window."""
    start, summarised = bindparam("start", type_=TZ), bindparam("summarised", type_=TZ)
    first = func.date_trunc("minute", start)

    def bucket(at: ColumnElement[datetime]) -> ColumnElement[int]:
        # A minute counts where it starts; the one holding the window's start, first.
        return _bucket_of(func.greatest(at, start))

    block = run_blocks.c.block
    whole = (
        select(block)
        .where(
            # Bounds on the key itself: a range of the primary key.
            block >= first,
            block <= summarised - BLOCK,
            bucket(block) == bucket(block + (BLOCK - _INSTANT)),
        )
        .group_by(block)
        # A broken row (minutes of the block deleted or changed) breaks the block.
        .having(func.bool_and(~run_blocks.c.broken))
        .cte("whole_blocks")
    )
    # The other minutes, block by block: an index range each, not the window's every
    # minute filtered.
    seconds = BLOCK.total_seconds()
    first_block = func.to_timestamp(func.floor(func.date_part("epoch", first) / seconds) * seconds)
    other = (
        func.generate_series(first_block, summarised, literal(BLOCK))
        .table_valued(column("block", TZ))
        .render_derived(name="other_blocks")
    )
    minute = run_minutes.c.minute
    in_other = and_(
        minute >= func.greatest(other.c.block, first),
        minute < func.least(other.c.block + BLOCK, summarised),
    )
    parts = union_all(
        select(bucket(block).label("bucket"), *_summed(run_blocks)).where(
            block.in_(select(whole.c.block))
        ),
        select(bucket(minute).label("bucket"), *_summed(run_minutes))
        .select_from(other.join(run_minutes, in_other))
        .where(other.c.block.not_in(select(whole.c.block))),
    ).subquery("summary")
    bins = [func.sum(parts.c.lateness_bins[index + 1]) for index in range(LATENESS_BINS)]
    return select(
        parts.c.bucket,
        parts.c.state,
        func.sum(parts.c.runs).label("runs"),
        func.max(parts.c.lateness_max).label("slowest"),
        *(count.label(f"bin{index}") for index, count in enumerate(bins)),
    ).group_by(text("1, 2"))


def _summed(table: Table) -> tuple[ColumnElement[Any], ...]:
    return (table.c.state, table.c.runs, table.c.lateness_max, table.c.lateness_bins)


def _run_stats(
    window: timedelta,
    width: timedelta,
    now: datetime,
    starts: list[datetime],
    bucket: Callable[[int], tuple[dict[RunState, int], Percentiles | None]],
    *,
    whole: tuple[dict[RunState, int], Percentiles | None],
    summarised: datetime | None = None,
) -> RunStats:
    """The statistics, ``bucket(index)`` giving the counts and lateness of each bucket
    (1 is the first), ``whole`` those of the window."""
    counts, lateness = whole
    buckets = []
    for index, start in enumerate(starts):
        bucket_counts, bucket_lateness = bucket(index + 1)
        buckets.append(StatsBucket(start=start, counts=bucket_counts, lateness=bucket_lateness))
    return RunStats(
        window=window,
        bucket=width,
        now=now,
        buckets=buckets,
        total_counts=counts,
        lateness=lateness,
        summarised_until=summarised,
    )


def _stats_query(schedule: str | None) -> Select[Any]:
    """Counts by state and lateness percentiles per bucket (``width_bucket`` over the
    bucket starts: exact, and the same bounds as the Python side), and over the whole
    window (``ROLLUP``'s grand total, told apart by ``GROUPING``): every run read
    live, the percentiles exact."""
    window = _window_runs(schedule)
    bucket = _bucket_of(window.c.at)
    columns: list[ColumnElement[Any]] = [
        bucket.label("bucket"),
        (func.grouping(bucket) == 1).label("whole"),
    ]
    columns += [
        func.count().filter(window.c.state == literal(state.value)).label(state.value)
        for state in RunState
    ]
    quantiles = literal(list(QUANTILES), ARRAY(Double))
    return select(
        *columns,
        func.percentile_cont(quantiles).within_group(window.c.lateness).label("quantiles"),
        func.max(window.c.lateness).label("slowest"),
    ).group_by(func.rollup(bucket))


@functools.cache
def _binned_query() -> Select[Any]:
    """The runs of the window not in the summary (finished from ``:summarised`` on, and
    not finished), counted by bucket, state and lateness bin as the summary bins them:
    a few hundred rows whatever the runs, which merge with the summary's."""
    window = _window_runs(None, summarised=True)
    return select(
        _bucket_of(window.c.at).label("bucket"),
        window.c.state,
        lateness_bin(window.c.lateness).label("bin"),
        func.count().label("runs"),
        func.max(window.c.lateness).label("slowest"),
    ).group_by(text("1, 2, 3"))


def _bucket_of(at: ColumnElement[datetime]) -> ColumnElement[int]:
    """The bucket of a time (1 is the first): ``width_bucket`` over the bucket starts."""
    return func.width_bucket(at, bindparam("starts", type_=ARRAY(TZ)))


def _window_runs(schedule: str | None, *, summarised: bool = False) -> Subquery:
    """The runs whose time is in ``:start`` .. ``:now`` (see the module docstring for
    the index each part uses): their time, state and lateness."""
    at = func.coalesce(runs.c.fire_at, runs.c.claimed_at)
    lateness = lateness_seconds()
    start, now = bindparam("start", type_=TZ), bindparam("now", type_=TZ)

    def part(
        *conditions: ColumnElement[bool] | TextClause, time: ColumnElement[datetime] = at
    ) -> Select[Any]:
        return select(time.label("at"), runs.c.state, lateness.label("lateness")).where(*conditions)

    if schedule is not None:
        named = runs.c.schedule_name == schedule
        parts = [
            # Its time is its fire time, which the history index holds with the state
            # and the time it was sent: the index alone is read, not a page per run.
            part(named, runs.c.fire_at.between(start, now), time=runs.c.fire_at),
            part(named, runs.c.fire_at.is_(None), runs.c.claimed_at.between(start, now)),
        ]
    else:
        in_window = at.between(start, now)
        finished_since = [finished_age() >= (start - FINISHED_MARGIN)]
        if summarised:
            finished_since.append(finished_age() >= bindparam("summarised", type_=TZ))
        # The indexes' predicates as literal SQL: a bound parameter would keep a
        # generic plan from using the partial indexes.
        parts = [
            part(text(FINISHED_SQL), *finished_since, in_window),
            part(text(ACTIVE_SQL), in_window),
        ]
    return union_all(*parts).subquery("window_runs")


#: Every state, and the state of each value: looked up once a cell.
_ALL_STATES = tuple(RunState)
_STATES = {state.value: state for state in RunState}


def _no_runs() -> dict[RunState, int]:
    return dict.fromkeys(_ALL_STATES, 0)


def _counts(row: Any) -> dict[RunState, int]:
    return {state: 0 if row is None else getattr(row, state.value) for state in RunState}


def _add(counts: dict[RunState, int], more: dict[RunState, int] | None) -> dict[RunState, int]:
    if more is None:
        return counts
    return {state: count + more[state] for state, count in counts.items()}


def _percentiles(row: Any) -> Percentiles | None:
    if row is None or row.slowest is None:
        return None
    p50, p95, p99 = row.quantiles
    return Percentiles(p50=p50, p95=p95, p99=p99, max=row.slowest)
