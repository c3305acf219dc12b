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

A bucket's percentiles that include summarised runs are read from merged
histograms (``LATENESS_BINS``, ``Percentiles.approximate``): each value taken at the
middle of its bin, within 9 % of the true one (0.5 ms below 1 ms); the maximum stays
exact.
With ``schedule``, everything is read live and exact (a schedule's runs are few).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import (
    ColumnElement,
    Connection,
    Double,
    Select,
    Subquery,
    TextClause,
    bindparam,
    func,
    insert,
    literal,
    select,
    text,
    union_all,
    update,
)
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.dialects.postgresql import insert as pg_insert

from beat.models import RunState
from beat.store.db import StoreConnection
from beat.store.percentiles import (
    LATENESS_BINS,
    QUANTILES,
    Percentiles,
    bin_of,
    histogram_percentiles,
    lateness_bin,
)
from beat.store.rows import lateness_seconds
from beat.store.tables import ACTIVE_SQL, FINISHED_SQL, TZ, run_minutes, run_summary, runs

#: The narrowest bucket: a shorter window gets fewer buckets.
MIN_BUCKET = timedelta(minutes=1)
#: How long before its fire time a run may be claimed (``habeat_claim_ahead`` is at
#: most 30 s), with room to spare: how far before the window the scan of the
#: finished runs starts.
FINISHED_MARGIN = timedelta(minutes=1)
#: How long after the end of a minute it is summarised. A run's ``finished_at`` is
#: the ``now()`` of the transaction that finished it, its start: the run becomes
#: visible when that transaction commits, a little later. Those transactions are one
#: statement (a worker's outcome) or the leader's claim and reaper transactions,
#: which the idle timeout of the claim bounds to seconds; two minutes leave a wide
#: margin. A run committed later than that is never summarised (nor counted live).
SETTLE = timedelta(minutes=2)
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
    start = now - window
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
            now: datetime = conn.execute(select(func.now())).scalar_one()
            width, starts = bucket_starts(now, window, buckets)
            summarised = None
            if schedule is None:
                summarised = conn.execute(select(run_summary.c.summarised_until)).scalar()
            params = {"start": starts[0], "now": now, "starts": starts, "summarised": summarised}
            rows = conn.execute(_stats_query(schedule, summarised is not None), params).all()
            summary = _Summary.read(conn, params) if summarised is not None else _Summary()
        by_bucket = {row.bucket: row for row in rows if not row.whole}
        whole = next((row for row in rows if row.whole), None)
        whole_bins: list[int] = [0] * LATENESS_BINS
        stats_buckets = []
        for index, start in enumerate(starts):
            row = by_bucket.get(index + 1)
            bins = summary.bins.get(index + 1)
            if bins is not None:
                whole_bins = [a + b for a, b in zip(whole_bins, bins, strict=True)]
            stats_buckets.append(
                StatsBucket(
                    start=start,
                    counts=_add(_counts(row), summary.counts.get(index + 1)),
                    lateness=_merged(row, bins, summary.slowest.get(index + 1)),
                )
            )
        total = _counts(whole)
        for counts in summary.counts.values():
            total = _add(total, counts)
        slowest = max(summary.slowest.values(), default=None)
        return RunStats(
            window=window,
            bucket=width,
            now=now,
            buckets=stats_buckets,
            total_counts=total,
            lateness=_merged(whole, whole_bins if summary.bins else None, slowest),
            summarised_until=summarised,
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
                step = _summarise_batch(conn, until, batch)
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
            oldest = select(func.min(_finished_at())).where(text(FINISHED_SQL)).scalar_subquery()
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
        statement = run_minutes.delete().where(run_minutes.c.minute < cutoff)
        if conn is not None:
            return conn.execute(statement).rowcount
        with self._transaction() as own:
            return own.execute(statement).rowcount


def _finished_at() -> ColumnElement[datetime]:
    """The key of the retention index and of the summary."""
    return func.coalesce(runs.c.finished_at, runs.c.claimed_at)


def _summarise_batch(
    conn: Connection, until: datetime | None, batch: timedelta
) -> tuple[datetime, bool, int, int, int] | None:
    """One transaction of :meth:`RunStatsStore.summarise`: None if another process
    holds the summary, else ``(summarised_until, caught_up, runs, rows, moved)``."""
    settled = func.date_trunc("minute", func.now() - SETTLE)
    found = conn.execute(
        select(run_summary.c.summarised_until, settled.label("settled")).with_for_update(
            skip_locked=True
        )
    ).first()
    if found is None:
        return None
    start: datetime = found.summarised_until
    limit: datetime = found.settled
    if until is not None:
        limit = min(limit, until.replace(second=0, microsecond=0))
    if start >= limit:
        return start, True, 0, 0, 0
    # Skip the minutes without a finished run (a fresh start, a quiet night) at once.
    age = _finished_at()
    following = conn.execute(
        select(func.date_trunc("minute", func.min(age))).where(text(FINISHED_SQL), age >= start)
    ).scalar()
    first = limit if following is None else min(max(start, following), limit)
    end = min(first + batch, limit)
    summarised_runs, rows = 0, 0
    if first < end:
        summarised_runs, rows = _summarise_minutes(conn, first, end)
    conn.execute(update(run_summary).values(summarised_until=end))
    return end, end >= limit, summarised_runs, rows, 1


def _summarise_minutes(conn: Connection, first: datetime, end: datetime) -> tuple[int, int]:
    """Insert the summary of the finished runs of ``first`` .. ``end`` (minutes)."""
    age = _finished_at()
    lateness = lateness_seconds()
    grouped = conn.execute(
        select(
            func.date_trunc("minute", age).label("minute"),
            runs.c.state,
            lateness_bin(lateness).label("bin"),
            func.count().label("runs"),
            func.max(lateness).label("slowest"),
            func.sum(lateness).label("total"),
        )
        # The retention index, in its order (its predicate as literal SQL).
        .where(text(FINISHED_SQL), age >= first, age < end)
        .group_by(text("1, 2, 3"))
    ).all()
    minutes: dict[tuple[datetime, str], dict[str, Any]] = {}
    for row in grouped:
        entry = minutes.setdefault(
            (row.minute, row.state),
            {
                "minute": row.minute,
                "state": row.state,
                "runs": 0,
                "published": 0,
                "lateness_bins": None,
                "lateness_max": None,
                "lateness_sum": None,
            },
        )
        entry["runs"] += row.runs
        if row.bin is None:
            continue
        if entry["lateness_bins"] is None:
            entry |= {"lateness_bins": [0] * LATENESS_BINS, "lateness_max": row.slowest}
            entry["lateness_sum"] = 0.0
        entry["published"] += row.runs
        entry["lateness_bins"][row.bin] += row.runs
        entry["lateness_max"] = max(entry["lateness_max"], row.slowest)
        entry["lateness_sum"] += row.total
    if minutes:
        conn.execute(insert(run_minutes), list(minutes.values()))
    return sum(entry["runs"] for entry in minutes.values()), len(minutes)


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
        start = bindparam("start", type_=TZ)
        minutes = (
            select(
                func.width_bucket(
                    func.greatest(run_minutes.c.minute, start),
                    bindparam("starts", type_=ARRAY(TZ)),
                ).label("bucket"),
                run_minutes.c.state,
                run_minutes.c.runs,
                run_minutes.c.lateness_bins,
                run_minutes.c.lateness_max,
            )
            .where(
                run_minutes.c.minute >= func.date_trunc("minute", start),
                run_minutes.c.minute < bindparam("summarised", type_=TZ),
            )
            .cte("minutes")
        )
        summary = cls()
        for row in conn.execute(
            select(
                minutes.c.bucket,
                minutes.c.state,
                func.sum(minutes.c.runs).label("runs"),
                func.max(minutes.c.lateness_max).label("slowest"),
            ).group_by(minutes.c.bucket, minutes.c.state),
            params,
        ):
            counts = summary.counts.setdefault(row.bucket, dict.fromkeys(RunState, 0))
            counts[RunState(row.state)] += int(row.runs)
            if row.slowest is not None:
                summary.slowest[row.bucket] = max(
                    row.slowest, summary.slowest.get(row.bucket, row.slowest)
                )
        cells = (
            func.unnest(minutes.c.lateness_bins)
            .table_valued("count", with_ordinality="bin")
            .render_derived()
        )
        for cell in conn.execute(
            select(minutes.c.bucket, cells.c.bin, func.sum(cells.c.count).label("runs"))
            .select_from(minutes.join(cells, literal(True)))
            .where(cells.c.count > 0)
            .group_by(minutes.c.bucket, cells.c.bin),
            params,
        ):
            bins = summary.bins.setdefault(cell.bucket, [0] * LATENESS_BINS)
            bins[cell.bin - 1] += int(cell.runs)
        return summary


def _stats_query(schedule: str | None, summarised: bool = False) -> Select[Any]:
    """Counts by state and lateness percentiles per bucket (``width_bucket`` over the
    bucket starts: exact, and the same bounds as the Python side), and over the whole
    window (``ROLLUP``'s grand total, told apart by ``GROUPING``). ``summarised``:
    finished runs before ``:summarised`` are left to the summary, and the lateness of
    the others is returned too (``late``), to merge with its histograms."""
    window = _window_runs(schedule, summarised)
    bucket = func.width_bucket(window.c.at, bindparam("starts", type_=ARRAY(TZ)))
    counts = [
        func.count().filter(window.c.state == literal(state.value)).label(state.value)
        for state in RunState
    ]
    quantiles = literal(list(QUANTILES), ARRAY(Double))
    late = []
    if summarised:
        late = [func.array_agg(window.c.lateness).filter(window.c.lateness.is_not(None))]
    return select(
        bucket.label("bucket"),
        (func.grouping(bucket) == 1).label("whole"),
        *counts,
        func.percentile_cont(quantiles).within_group(window.c.lateness).label("quantiles"),
        func.max(window.c.lateness).label("slowest"),
        *(values.label("late") for values in late),
    ).group_by(func.rollup(bucket))


def _window_runs(schedule: str | None, summarised: bool = False) -> Subquery:
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
        finished_since = [_finished_at() >= (start - FINISHED_MARGIN)]
        if summarised:
            finished_since.append(_finished_at() >= bindparam("summarised", type_=TZ))
        # The indexes' predicates as literal SQL: a bound parameter would keep a
        # generic plan from using the partial indexes.
        parts = [
            part(text(FINISHED_SQL), *finished_since, in_window),
            part(text(ACTIVE_SQL), in_window),
        ]
    return union_all(*parts).subquery("window_runs")


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


def _merged(row: Any, bins: list[int] | None, slowest: float | None) -> Percentiles | None:
    """The percentiles of the live runs of ``row`` (exact) or, with summarised runs
    (``bins``, their maximum ``slowest``), of both from one histogram."""
    if bins is None or slowest is None:
        return _percentiles(row)
    merged = list(bins)
    if row is not None and row.slowest is not None:
        slowest = max(slowest, row.slowest)
        for seconds in row.late or ():
            merged[bin_of(seconds)] += 1
    return histogram_percentiles(merged, slowest)
