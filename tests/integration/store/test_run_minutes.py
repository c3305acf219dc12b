"""The summary of finished runs by minute (``beat.store.stats``), against real
PostgreSQL: exact counts, percentiles within a bin of the truth, the seam between
the summary and the live runs, concurrent summarisers, catch-up, retention."""

from __future__ import annotations

import random
import statistics
import threading
import uuid
from collections import Counter
from datetime import datetime, timedelta
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sqlalchemy import insert, select, text

from beat.models import FINISHED_STATES, RunState
from beat.ops.schedules import Schedules
from beat.store.all_roles import Store
from beat.store.leader import LeaderStore
from beat.store.percentiles import bin_of, histogram_percentiles
from beat.store.stats import SETTLE, RunStats, RunStatsStore
from beat.store.tables import run_minutes, runs

pytestmark = pytest.mark.integration

STATES = [*RunState]


def minute_of(at: datetime) -> datetime:
    return at.replace(second=0, microsecond=0)


def add_runs(store: Store, rng: random.Random, count: int, *, oldest: timedelta) -> None:
    """``count`` runs fired up to ``oldest`` ago, in any state; finished ones finish
    up to a minute after their fire time, published ones up to 10 s late."""
    now = store.now()
    rows = []
    for _ in range(count):
        fire_at = now - oldest * rng.random()
        state = rng.choice(STATES)
        late = None if rng.random() < 0.2 else rng.lognormvariate(-3, 2)
        finished = state in FINISHED_STATES
        rows.append(
            {
                "id": uuid.uuid4(),
                "schedule_name": f"s{rng.randrange(5)}",
                "task": "tasks.demo.add",
                "state": state.value,
                "fire_at": fire_at,
                "claimed_at": fire_at,
                "published_at": None if late is None else fire_at + timedelta(seconds=late),
                "finished_at": fire_at + timedelta(seconds=rng.uniform(0, 60))
                if finished
                else None,
            }
        )
    with store.engine.begin() as conn:
        conn.execute(insert(runs), rows)


def stored(store: Store) -> list[Any]:
    with store.engine.connect() as conn:
        return list(conn.execute(select(runs)))


def summary_rows(store: Store) -> Counter[tuple[datetime, str]]:
    with store.engine.connect() as conn:
        return Counter(
            {(row.minute, row.state): row.runs for row in conn.execute(select(run_minutes))}
        )


def finished_by_minute(rows: list[Any], until: datetime) -> Counter[tuple[datetime, str]]:
    return Counter(
        (minute_of(row.finished_at), row.state)
        for row in rows
        if row.state in FINISHED_STATES and row.finished_at < until
    )


def test_summarising_is_exact_and_idempotent(store: Store) -> None:
    add_runs(store, random.Random(1), 600, oldest=timedelta(hours=2))
    summary = RunStatsStore(store.engine)

    report = summary.summarise(batch=timedelta(minutes=7))

    assert report.caught_up
    assert report.summarised_until is not None
    until = report.summarised_until
    assert until == minute_of(store.now() - SETTLE) or until == minute_of(
        store.now() - SETTLE
    ) - timedelta(minutes=1)
    expected = finished_by_minute(stored(store), until)
    assert summary_rows(store) == expected
    assert report.runs == sum(expected.values())
    again = summary.summarise()
    assert again.runs == 0
    assert summary_rows(store) == expected


def oracle_counts(rows: list[Any], stats: RunStats) -> dict[int | None, Counter[RunState]]:
    """Counts by bucket under the documented semantics: a finished run before
    ``summarised_until`` at the minute it finished (the minute holding the window's
    start in the first bucket), every other run at its fire time."""
    assert stats.summarised_until is not None
    starts = [bucket.start for bucket in stats.buckets]
    counts: dict[int | None, Counter[RunState]] = {None: Counter()}
    for row in rows:
        age = row.finished_at or row.claimed_at
        if row.state in FINISHED_STATES and age < stats.summarised_until:
            at = max(minute_of(age), stats.start)
            if minute_of(age) < minute_of(stats.start):
                continue
        else:
            at = row.fire_at or row.claimed_at
            if not stats.start <= at <= stats.now:
                continue
        index = sum(1 for start in starts if start <= at) - 1
        for key in (index, None):
            counts.setdefault(key, Counter())[RunState(row.state)] += 1
    return counts


def test_the_summary_and_the_live_runs_meet_without_a_gap_or_an_overlap(store: Store) -> None:
    rng = random.Random(2)
    add_runs(store, rng, 400, oldest=timedelta(minutes=90))
    RunStatsStore(store.engine).summarise()
    # Finished since: not settled, so not summarised, counted live.
    add_runs(store, rng, 100, oldest=timedelta(minutes=2))

    stats = Schedules(store).run_stats(timedelta(hours=1), buckets=12)

    assert stats.summarised_until is not None
    assert stats.summarised_until <= stats.now - SETTLE
    expected = oracle_counts(stored(store), stats)
    for index, bucket in enumerate(stats.buckets):
        assert Counter(bucket.counts) + Counter() == expected.get(index, Counter()), index
    assert Counter(stats.total_counts) + Counter() == expected[None]


def assert_within_a_bin_of_every_published_run(store: Store, stats: RunStats) -> None:
    """The window's lateness, read from histograms: its maximum exact, its percentiles
    within a bin of those of every published run stored."""
    late = [
        (row.published_at - row.fire_at).total_seconds()
        for row in stored(store)
        if row.published_at is not None
    ]
    assert stats.lateness is not None
    assert stats.lateness.approximate
    assert stats.lateness.max == pytest.approx(max(late))
    cuts = statistics.quantiles(late, n=100, method="inclusive")
    for estimate, truth in zip(
        (stats.lateness.p50, stats.lateness.p95, stats.lateness.p99),
        (cuts[49], cuts[94], cuts[98]),
        strict=True,
    ):
        assert estimate == pytest.approx(truth, rel=0.1, abs=0.001)


@settings(max_examples=20, deadline=None)
@given(
    st.lists(st.floats(min_value=0.001, max_value=3000, allow_nan=False), min_size=1, max_size=300)
)
def test_percentiles_from_the_histogram_are_within_a_bin(values: list[float]) -> None:
    bins = [0] * 90
    for value in values:
        bins[bin_of(value)] += 1
    found = histogram_percentiles(bins, max(values))
    assert found is not None
    assert found.approximate
    assert found.max == max(values)
    if len(values) == 1:
        exact = [values[0]] * 3
    else:
        cuts = statistics.quantiles(values, n=100, method="inclusive")
        exact = [cuts[49], cuts[94], cuts[98]]
    for estimate, truth in zip((found.p50, found.p95, found.p99), exact, strict=True):
        assert estimate == pytest.approx(truth, rel=0.1)


def test_stats_of_summarised_minutes_read_the_histograms(store: Store) -> None:
    add_runs(store, random.Random(3), 500, oldest=timedelta(hours=3))
    RunStatsStore(store.engine).summarise()

    stats = Schedules(store).run_stats(timedelta(hours=6), buckets=6)

    assert_within_a_bin_of_every_published_run(store, stats)


def test_runs_not_yet_summarised_merge_into_the_histograms_of_their_bucket(
    store: Store,
) -> None:
    add_runs(store, random.Random(5), 300, oldest=timedelta(hours=3))
    RunStatsStore(store.engine).summarise()
    # Fired in the last minute, finished or not: read live, binned in SQL.
    add_runs(store, random.Random(6), 300, oldest=timedelta(minutes=1))

    stats = Schedules(store).run_stats(timedelta(hours=6), buckets=6)

    assert stats.summarised_until is not None
    newest = stats.buckets[-1]
    assert newest.start <= stats.now - timedelta(minutes=1)
    # The newest bucket holds runs read live only: its percentiles come from their bins.
    assert newest.lateness is not None
    assert newest.lateness.approximate
    assert_within_a_bin_of_every_published_run(store, stats)
    assert Counter(stats.total_counts) + Counter() == oracle_counts(stored(store), stats)[None]


def test_two_summarisers_at_once_write_each_minute_once(store: Store) -> None:
    add_runs(store, random.Random(4), 800, oldest=timedelta(hours=4))
    stores = [RunStatsStore(store.engine) for _ in range(2)]
    errors: list[BaseException] = []

    def work(summary: RunStatsStore) -> None:
        try:
            while not summary.summarise(batch=timedelta(minutes=3)).caught_up:
                pass
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(summary,)) for summary in stores]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert not errors
    until = stores[0].summarise().summarised_until
    assert until is not None
    assert summary_rows(store) == finished_by_minute(stored(store), until)


def test_a_backlog_is_caught_up_in_passes_within_the_budget(store: Store) -> None:
    add_runs(store, random.Random(5), 1000, oldest=timedelta(hours=8))
    summary = RunStatsStore(store.engine)

    passes = []
    while not (report := summary.summarise(budget=0.0, batch=timedelta(minutes=30))).caught_up:
        passes.append(report)
    assert passes
    assert all(report.batches == 1 for report in passes)
    assert len(passes) >= 8 * 2 - 1
    assert report.summarised_until is not None
    assert summary_rows(store) == finished_by_minute(stored(store), report.summarised_until)


def test_retention_deletes_the_summary_of_the_runs_it_deletes(store: Store) -> None:
    add_runs(store, random.Random(6), 300, oldest=timedelta(hours=5))
    RunStatsStore(store.engine).summarise()
    leader = LeaderStore(store.engine)

    report = leader.prune(timedelta(hours=2))

    assert report.deleted > 0
    rows = summary_rows(store)
    assert rows
    assert min(minute for minute, _ in rows) >= minute_of(report.cutoff)
    kept = stored(store)
    assert all(
        count
        == sum(
            1 for run in kept if (minute_of(run.finished_at or run.claimed_at), run.state) == key
        )
        for key, count in rows.items()
    )


def test_retention_leaves_no_summary_of_a_minute_whose_runs_it_began_to_delete(
    store: Store,
) -> None:
    """The cutoff falls inside a minute: its runs before the cutoff go, so its summary
    would count runs that are gone. It goes with them."""
    now = store.now()
    older_than = timedelta(hours=2)
    cutoff_then = now - older_than
    rows = [
        {
            "id": uuid.uuid4(),
            "schedule_name": "edge",
            "task": "tasks.demo.add",
            "state": RunState.SUCCEEDED.value,
            "fire_at": at,
            "claimed_at": at,
            "published_at": at,
            "finished_at": at,
        }
        for at in (
            # The cutoff's own minute, before the cutoff: its first instant (a second into
            # it is after a cutoff that falls in the minute's first second).
            minute_of(cutoff_then),
            cutoff_then + timedelta(minutes=1),  # kept, in the next minute
            cutoff_then + timedelta(minutes=30),  # kept
        )
    ]
    with store.engine.begin() as conn:
        conn.execute(insert(runs), rows)
    RunStatsStore(store.engine).summarise()
    assert sum(summary_rows(store).values()) == 3

    report = LeaderStore(store.engine).prune(older_than)

    assert report.deleted == 1
    kept = stored(store)
    counted = Counter((minute_of(run.finished_at), run.state) for run in kept)
    assert all(count <= counted[key] for key, count in summary_rows(store).items()), (
        "no summary counts a run that retention deleted"
    )


def test_the_planner_knows_how_many_runs_a_window_holds(store: Store) -> None:
    """The statistics of migration 0022: the window's filter on a run's time is
    estimated from the data, not at PostgreSQL's fixed 0.5 % of the rows (which made
    the live runs of a plot be sorted on disk rather than hashed)."""
    add_runs(store, random.Random(22), 4000, oldest=timedelta(hours=4))
    window = (
        "FROM beat_runs WHERE coalesce(fire_at, claimed_at)"
        " BETWEEN now() - interval '1 hour' AND now()"
    )
    with store.engine.begin() as conn:
        conn.execute(text("ANALYZE beat_runs"))
        plan = conn.execute(text(f"EXPLAIN (FORMAT JSON) SELECT 1 {window}")).scalar_one()
        actual = conn.execute(text(f"SELECT count(*) {window}")).scalar_one()

    estimated = plan[0]["Plan"]["Plan Rows"]
    assert actual > 500
    assert actual / 2 < estimated < actual * 2
