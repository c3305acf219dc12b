"""The summary by block of ten minutes (``beat_run_blocks``, migration 0024): its
triggers keep each block the sum of its minutes, whoever writes them, and drop it when
minutes of it go; the plots' read of the summary (blocks where ten minutes lie in one
bucket, minutes elsewhere) counts what a read of every minute counts, checked against
an oracle in Python over random minutes, windows, buckets and retention cutoffs."""

from __future__ import annotations

import bisect
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import delete, insert, select, text
from sqlalchemy.dialects.postgresql import insert as pg_insert

from beat.models import RunState
from beat.store.all_roles import Store
from beat.store.percentiles import LATENESS_BINS
from beat.store.schema import migrate
from beat.store.stats import RunStatsStore, _Summary, bucket_starts
from beat.store.tables import run_blocks, run_minutes
from tests.conftest import SessionEnv
from tests.integration.helpers import database_at

pytestmark = pytest.mark.integration

NOW = datetime(2026, 12, 1, 12, 0, 7, 250_000, tzinfo=UTC)
FINISHED = [RunState.SUCCEEDED, RunState.FAILED, RunState.LOST, RunState.SKIPPED]


@dataclass(frozen=True)
class Minute:
    #: Minutes before ``NOW``'s minute.
    ago: int
    state: RunState
    runs: int
    #: Sparse histogram (bin → runs); None: no run of the minute was published.
    bins: dict[int, int] | None
    slowest: float | None

    @property
    def minute(self) -> datetime:
        return NOW.replace(second=0, microsecond=0) - timedelta(minutes=self.ago)

    def row(self) -> dict[str, Any]:
        histogram = None
        if self.bins is not None:
            histogram = [self.bins.get(index, 0) for index in range(LATENESS_BINS)]
        published = 0 if self.bins is None else sum(self.bins.values())
        return {
            "minute": self.minute,
            "state": self.state.value,
            "runs": self.runs,
            "published": published,
            "lateness_bins": histogram,
            "lateness_max": self.slowest,
            "lateness_sum": None if self.bins is None else 0.5 * published,
        }


def minutes_strategy(span: int) -> st.SearchStrategy[list[Minute]]:
    histogram = st.dictionaries(
        st.integers(0, LATENESS_BINS - 1), st.integers(1, 50), min_size=1, max_size=4
    )
    minute = st.builds(
        lambda ago, state, runs, bins, slowest: Minute(
            ago, state, runs, bins, None if bins is None else slowest
        ),
        st.integers(0, span),
        st.sampled_from(FINISHED),
        st.integers(1, 100),
        st.none() | histogram,
        st.floats(0.001, 500.0),
    )
    return st.lists(minute, max_size=80, unique_by=lambda m: (m.ago, m.state))


def write(store: Store, minutes: list[Minute], statements: int) -> None:
    """The minutes written in ``statements`` INSERTs (a block filled by several)."""
    rows = [minute.row() for minute in minutes]
    with store.engine.begin() as conn:
        conn.execute(delete(run_minutes))
        for part in range(statements):
            chunk = rows[part::statements]
            if chunk:
                conn.execute(insert(run_minutes), chunk)


def oracle(
    minutes: list[Minute], start: datetime, starts: list[datetime], summarised: datetime
) -> tuple[dict[int, dict[RunState, int]], dict[int, list[int]], dict[int, float]]:
    """What a read of every minute gives: a minute in ``[start's minute, summarised)``
    counts in the bucket where it starts (the first for the one holding ``start``)."""
    counts: dict[int, dict[RunState, int]] = {}
    bins: dict[int, list[int]] = {}
    slowest: dict[int, float] = {}
    first = start.replace(second=0, microsecond=0)
    for minute in minutes:
        if not first <= minute.minute < summarised:
            continue
        bucket = bisect.bisect_right(starts, max(minute.minute, start))
        counts.setdefault(bucket, dict.fromkeys(RunState, 0))[minute.state] += minute.runs
        if minute.bins is None or minute.slowest is None:
            continue
        merged = bins.setdefault(bucket, [0] * LATENESS_BINS)
        for index, count in minute.bins.items():
            merged[index] += count
        slowest[bucket] = max(slowest.get(bucket, minute.slowest), minute.slowest)
    return counts, bins, slowest


def read(store: Store, start: datetime, starts: list[datetime], summarised: datetime) -> _Summary:
    with store.engine.connect() as conn:
        params = {"start": start, "starts": starts, "summarised": summarised}
        return _Summary.read(conn, params)


def insert_minutes(store: Store, minutes: list[Minute]) -> None:
    if minutes:
        with store.engine.begin() as conn:
            conn.execute(insert(run_minutes), [minute.row() for minute in minutes])


def delete_before(store: Store, cutoff: datetime) -> None:
    with store.engine.begin() as conn:
        conn.execute(delete(run_minutes).where(run_minutes.c.minute < cutoff))


def assert_read_as_every_minute(
    store: Store, minutes: list[Minute], window: timedelta, buckets: int, summarised: datetime
) -> None:
    _, starts = bucket_starts(NOW, window, buckets)
    start = NOW - window
    summary = read(store, start, starts, summarised)
    counts, bins, slowest = oracle(minutes, start, starts, summarised)
    assert summary.counts == counts
    assert summary.bins == bins
    assert summary.slowest == slowest


@settings(
    max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    minutes=minutes_strategy(span=3 * 24 * 60),
    window=st.integers(10, 3 * 24 * 60),
    buckets=st.integers(1, 60),
    settled=st.integers(0, 120),
    statements=st.integers(1, 3),
    frontier=st.integers(0, 3 * 24 * 60),
    retention=st.sampled_from(["none", "anywhere", "near the frontier"]),
    anywhere=st.integers(0, 3 * 24 * 60),
    gap=st.integers(-15, 15),
)
def test_the_summary_read_through_blocks_counts_what_every_minute_counts(
    store: Store,
    minutes: list[Minute],
    window: int,
    buckets: int,
    settled: int,
    statements: int,
    frontier: int,
    retention: str,
    anywhere: int,
    gap: int,
) -> None:
    """The minutes up to ``frontier`` minutes ago written (in ``statements`` INSERTs),
    then retention's delete before its cutoff, then the newer minutes, as the
    summariser goes on after a prune: a block the cutoff cut and minutes then filled
    included."""
    older = [minute for minute in minutes if minute.ago > frontier]
    write(store, older, statements)
    if retention != "none":
        ago = anywhere if retention == "anywhere" else max(0, frontier + gap)
        cutoff = NOW - timedelta(minutes=ago, seconds=13)
        delete_before(store, cutoff)
        older = [minute for minute in older if minute.minute >= cutoff]
    newer = [minute for minute in minutes if minute.ago <= frontier]
    insert_minutes(store, newer)
    summarised = NOW.replace(second=0, microsecond=0) - timedelta(minutes=settled)
    assert_read_as_every_minute(
        store, older + newer, timedelta(minutes=window), buckets, summarised
    )


@pytest.mark.parametrize("later", [RunState.SUCCEEDED, RunState.FAILED])
def test_a_block_cut_by_retention_then_filled_is_read_minute_by_minute(
    store: Store, later: RunState
) -> None:
    """Retention's cutoff falls in a block whose first minutes were summarised; the
    summariser then writes the block's last minutes (of the same state, or another):
    the block now holds only those, and must not be read as the block."""
    first = [Minute(ago, RunState.SUCCEEDED, 1, None, None) for ago in range(20, 13, -1)]
    last = [Minute(ago, later, 1, None, None) for ago in range(13, 10, -1)]
    insert_minutes(store, first)
    cutoff = first[3].minute + timedelta(seconds=13)
    delete_before(store, cutoff)
    insert_minutes(store, last)
    kept = [minute for minute in first if minute.minute >= cutoff] + last
    summarised = NOW.replace(second=0, microsecond=0)
    assert_read_as_every_minute(store, kept, timedelta(hours=2), 1, summarised)


def test_a_minute_moved_or_upserted_leaves_no_block_that_counts_it_wrong(store: Store) -> None:
    # 11:20 to 11:39 but 11:30: 11:20 moves there, from one block to the next.
    agos = [ago for ago in range(40, 20, -1) if ago != 30]
    minutes = [Minute(ago, RunState.SUCCEEDED, 1, {2: 1}, 0.003) for ago in agos]
    insert_minutes(store, minutes)
    moved = minutes[0]
    with store.engine.begin() as conn:
        conn.execute(
            run_minutes.update()
            .where(run_minutes.c.minute == moved.minute)
            .values(minute=run_minutes.c.minute + timedelta(minutes=10))
        )
    kept = [*minutes[1:], Minute(moved.ago - 10, moved.state, 1, {2: 1}, 0.003)]
    summarised = NOW.replace(second=0, microsecond=0)
    assert_read_as_every_minute(store, kept, timedelta(hours=2), 1, summarised)
    again = Minute(25, RunState.SUCCEEDED, 5, {2: 5}, 0.003)
    with store.engine.begin() as conn:
        conn.execute(
            pg_insert(run_minutes)
            .values([again.row()])
            .on_conflict_do_update(
                index_elements=[run_minutes.c.minute, run_minutes.c.state],
                set_={"runs": run_minutes.c.runs + 5},
            )
        )
    kept = [minute for minute in kept if minute.ago != 25]
    kept.append(Minute(25, RunState.SUCCEEDED, 6, {2: 1}, 0.003))
    assert_read_as_every_minute(store, kept, timedelta(hours=2), 1, summarised)


def blocks(store: Store) -> dict[tuple[datetime, str], Any]:
    with store.engine.connect() as conn:
        return {(row.block, row.state): row for row in conn.execute(select(run_blocks))}


def test_a_block_holds_the_sum_of_the_minutes_each_insert_added(store: Store) -> None:
    first = Minute(30, RunState.SUCCEEDED, 5, {3: 2, 10: 1}, 0.4)
    second = Minute(29, RunState.SUCCEEDED, 7, {3: 1, 89: 4}, 9.5)
    unpublished = Minute(28, RunState.SUCCEEDED, 2, None, None)
    write(store, [first], 1)
    with store.engine.begin() as conn:
        conn.execute(insert(run_minutes), [second.row(), unpublished.row()])
    (block,) = blocks(store).values()
    assert block.block == datetime.fromtimestamp(first.minute.timestamp() // 600 * 600, UTC)
    assert (block.runs, block.published, block.lateness_max) == (14, 8, 9.5)
    expected = [0] * LATENESS_BINS
    expected[3], expected[10], expected[89] = 3, 1, 4
    assert block.lateness_bins == expected
    assert block.lateness_sum == pytest.approx(4.0)


def test_a_block_of_minutes_none_published_has_no_histogram(store: Store) -> None:
    write(store, [Minute(30, RunState.SKIPPED, 3, None, None)], 1)
    (block,) = blocks(store).values()
    assert (block.runs, block.published, block.lateness_bins, block.lateness_max) == (
        3,
        0,
        None,
        None,
    )


def broken(store: Store) -> dict[str, bool]:
    return {state: row.broken for (_, state), row in blocks(store).items()}


def test_deleting_or_changing_a_minute_breaks_its_block_and_truncating_empties_them(
    store: Store,
) -> None:
    kept = Minute(0, RunState.FAILED, 1, {1: 1}, 0.002)
    old = [Minute(ago, RunState.SUCCEEDED, 1, {2: 1}, 0.003) for ago in (605, 606)]
    write(store, [kept, *old], 1)
    assert broken(store) == {"failed": False, "succeeded": False}
    delete_before(store, old[0].minute)
    assert broken(store) == {"failed": False, "succeeded": True}
    insert_minutes(store, [Minute(604, RunState.SUCCEEDED, 1, None, None)])
    assert broken(store) == {"failed": False, "succeeded": True}  # for good
    with store.engine.begin() as conn:
        conn.execute(run_minutes.update().values(runs=run_minutes.c.runs + 1))
    assert broken(store) == {"failed": True, "succeeded": True}
    with store.engine.begin() as conn:
        conn.execute(text("TRUNCATE beat_run_minutes"))
    assert blocks(store) == {}


def test_retention_deletes_the_blocks_whose_every_minute_it_deleted(store: Store) -> None:
    minutes = [Minute(ago, RunState.SUCCEEDED, 1, None, None) for ago in range(35, 0, -1)]
    insert_minutes(store, minutes)
    cutoff = minutes[12].minute + timedelta(seconds=13)  # 11:37:13, in block 11:30
    RunStatsStore(store.engine).delete_summary_before(cutoff)
    left = {block.block: block.broken for block in blocks(store).values()}
    first_kept = datetime.fromtimestamp(cutoff.timestamp() // 600 * 600, UTC)
    assert min(left) == first_kept
    assert left[first_kept] is True
    assert not any(is_broken for block, is_broken in left.items() if block > first_kept)


@pytest.fixture
def at_0023(test_env: SessionEnv) -> Iterator[Store]:
    with database_at(test_env, "0023") as store:
        yield store


def test_the_migration_makes_the_blocks_of_the_minutes_already_summarised(
    at_0023: Store,
) -> None:
    minutes = [
        Minute(ago, state, ago % 7 + 1, {ago % LATENESS_BINS: 2}, float(ago))
        for ago in range(0, 95, 3)
        for state in (RunState.SUCCEEDED, RunState.FAILED)
    ]
    with at_0023.engine.begin() as conn:
        conn.execute(text("INSERT INTO beat_run_summary (summarised_until) VALUES (now())"))
        conn.execute(insert(run_minutes), [minute.row() for minute in minutes])
    migrate(at_0023.engine, "0024")
    _, starts = bucket_starts(NOW, timedelta(hours=2), 3)
    start, summarised = NOW - timedelta(hours=2), NOW.replace(second=0, microsecond=0)
    summary = read(at_0023, start, starts, summarised)
    assert (summary.counts, summary.bins, summary.slowest) == oracle(
        minutes, start, starts, summarised
    )
    made = blocks(at_0023)
    assert sum(block.runs for block in made.values()) == sum(m.runs for m in minutes)
    assert len(made) == len({(m.minute.timestamp() // 600, m.state) for m in minutes})
