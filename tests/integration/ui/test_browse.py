"""What the schedules web UI reads, against real PostgreSQL: the schedule list's pages
and filters, a schedule's runs page by page, and the run statistics; each checked
against a plain Python oracle over the rows stored."""

from __future__ import annotations

import base64
import bisect
import random
import statistics
import uuid
from datetime import datetime, timedelta
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import event, insert, select, text

from beat.errors import InvalidSchedule, ScheduleNotFound
from beat.models import FINISHED_STATES, Origin, RunState
from beat.ops.schedules import SPARK_RUNS, Percentiles, RunStats, ScheduleFilter, Schedules
from beat.records import RunRecord
from beat.store.all_roles import Store
from beat.store.tables import runs

pytestmark = pytest.mark.integration


@pytest.fixture
def api(store: Store) -> Schedules:
    return Schedules(store)


def create(api: Schedules, name: str, task: str = "tasks.demo.add", **fields: Any) -> None:
    api.create(name, task, every=60, allow_unregistered=True, **fields)


def add_run(
    store: Store,
    name: str | None,
    *,
    fire_at: datetime | None,
    state: RunState = RunState.SUCCEEDED,
    late: float | None = 0.01,
    **columns: Any,
) -> uuid.UUID:
    """A run as the scheduler and a worker leave it: claimed at its fire time, published
    ``late`` seconds after it (None: not published), finished a second later."""
    claimed_at = columns.pop("claimed_at", fire_at)
    assert claimed_at is not None
    published_at = None if late is None or fire_at is None else fire_at + timedelta(seconds=late)
    finished_at = claimed_at + timedelta(seconds=1) if state in FINISHED_STATES else None
    values = {
        "id": uuid.uuid4(),
        "schedule_name": name,
        "task": "tasks.demo.add",
        "state": state.value,
        "fire_at": fire_at,
        "claimed_at": claimed_at,
        "published_at": published_at,
        "finished_at": finished_at,
    } | columns
    with store.engine.begin() as conn:
        conn.execute(insert(runs).values(**values))
    run_id: uuid.UUID = values["id"]
    return run_id


def names(api: Schedules, where: ScheduleFilter, *, limit: int = 50) -> list[str]:
    return [row.schedule.name for row in api.page(where, limit=limit).rows]


# -- the schedule list ----------------------------------------------------------------


def test_pages_of_the_schedule_list_go_by_name_and_count_every_match(api: Schedules) -> None:
    for name in ["delta", "alpha", "echo", "charlie", "bravo", "golf", "foxtrot"]:
        create(api, name)

    pages = [api.page(offset=offset, limit=3) for offset in (0, 3, 6, 9)]

    assert [[row.schedule.name for row in page.rows] for page in pages] == [
        ["alpha", "bravo", "charlie"],
        ["delta", "echo", "foxtrot"],
        ["golf"],
        [],
    ]
    assert {page.total for page in pages} == {7}
    assert [(page.offset, page.limit) for page in pages] == [(0, 3), (3, 3), (6, 3), (9, 3)]


def test_search_is_a_literal_case_insensitive_substring_of_name_or_task(
    api: Schedules,
) -> None:
    create(api, "report_daily")
    create(api, "reportXdaily")
    create(api, "percent", task="tasks.done-100%")  # names have no % or \\, tasks may
    create(api, "slash", task="tasks\\odd")
    create(api, "invoices", task="tasks.Billing.send")

    assert names(api, ScheduleFilter(search="_")) == ["report_daily"]  # not any one character
    assert names(api, ScheduleFilter(search="%")) == ["percent"]  # not anything
    assert names(api, ScheduleFilter(search="\\")) == ["slash"]
    assert names(api, ScheduleFilter(search="REPORT")) == ["reportXdaily", "report_daily"]
    assert names(api, ScheduleFilter(search="billing")) == ["invoices"]  # the task
    assert api.page(ScheduleFilter(search="nowhere")).total == 0


def test_paused_and_origin_filters(api: Schedules) -> None:
    create(api, "api-on")
    create(api, "api-off", enabled=False)
    create(api, "code-on", origin=Origin.CODE)
    create(api, "code-off", origin=Origin.CODE, enabled=False)

    assert names(api, ScheduleFilter(paused=True)) == ["api-off", "code-off"]
    assert names(api, ScheduleFilter(paused=False)) == ["api-on", "code-on"]
    assert names(api, ScheduleFilter(origin=Origin.CODE)) == ["code-off", "code-on"]
    assert names(api, ScheduleFilter(origin=Origin.API, paused=True)) == ["api-off"]


def test_failing_means_the_newest_run_failed_or_was_lost(api: Schedules, store: Store) -> None:
    now = store.now()
    histories = {
        "a-failed-last": [RunState.SUCCEEDED, RunState.FAILED],
        "b-failed-before": [RunState.FAILED, RunState.SUCCEEDED],
        "c-lost-last": [RunState.SUCCEEDED, RunState.LOST],
        "d-never-ran": [],
        "e-running-after-a-failure": [RunState.FAILED, RunState.RUNNING],
        "f-failed-paused": [RunState.FAILED],
    }
    for name, states in histories.items():
        create(api, name, enabled=not name.endswith("paused"))
        for age, state in enumerate(reversed(states)):  # the last state is the newest
            add_run(store, name, fire_at=now - timedelta(minutes=age + 1), state=state)
    # A run of no schedule (sent with delay()) that failed is no schedule's.
    add_run(store, None, fire_at=None, claimed_at=now, state=RunState.FAILED)

    assert names(api, ScheduleFilter(failing=True)) == [
        "a-failed-last",
        "c-lost-last",
        "f-failed-paused",
    ]
    assert api.page(ScheduleFilter(failing=True), limit=1).total == 3
    assert names(api, ScheduleFilter(failing=True, paused=False)) == [
        "a-failed-last",
        "c-lost-last",
    ]
    assert names(api, ScheduleFilter(failing=True, search="LOST")) == ["c-lost-last"]
    assert names(api, ScheduleFilter(failing=True, paused=True, origin=Origin.CODE)) == []


def test_a_row_carries_the_newest_run_and_the_lateness_of_the_latest_runs(
    api: Schedules, store: Store
) -> None:
    create(api, "busy")
    create(api, "idle")
    now = store.now()
    lateness: list[float | None] = []
    for index in range(SPARK_RUNS + 5):  # oldest first
        late = None if index % 7 == 3 else round(0.001 * index + 0.5 * (index % 3), 6)
        lateness.append(late)
        state = RunState.SKIPPED if late is None else RunState.SUCCEEDED
        newest = add_run(
            store, "busy", fire_at=now - timedelta(minutes=60 - index), state=state, late=late
        )
    add_run(store, "busy-other", fire_at=now, late=9.0)  # a name that starts like it: not its

    busy, idle = api.page().rows

    assert busy.last_run is not None
    assert (busy.last_run.id, busy.last_run.state) == (newest, state)
    assert busy.recent_lateness == pytest.approx(lateness[-SPARK_RUNS:])
    assert (idle.last_run, idle.recent_lateness) == (None, [])


# -- a schedule's runs ----------------------------------------------------------------


def oracle_order(found: list[RunRecord]) -> list[uuid.UUID]:
    """Newest first: no fire time first (where the index puts NULLs), then by fire time,
    then by run ID, all descending."""
    ordered = sorted(
        found, key=lambda r: (r.fire_at is None, r.fire_at or datetime.min, r.id), reverse=True
    )
    return [run.id for run in ordered]


def all_pages(api: Schedules, name: str, limit: int) -> list[list[RunRecord]]:
    pages, before = [], None
    while True:
        page = api.run_page(name, before=before, limit=limit)
        pages.append(page.runs)
        if page.next_before is None:
            return pages
        before = page.next_before


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    fire_minutes=st.lists(st.one_of(st.none(), st.integers(0, 6)), min_size=1, max_size=24),
    limit=st.integers(1, 7),
)
def test_paging_through_a_schedules_runs_shows_each_once_in_order(
    store: Store, api: Schedules, fire_minutes: list[int | None], limit: int
) -> None:
    """Fire times shared (runs of a schedule removed and made again under its name: no
    schedule_id, so no unique fire time) and missing ones page without a gap or repeat."""
    with store.engine.begin() as conn:
        conn.execute(text("DELETE FROM beat_runs"))
    now = store.now()
    for minute in fire_minutes:
        fire_at = None if minute is None else now - timedelta(minutes=minute)
        add_run(store, "paged", fire_at=fire_at, claimed_at=now)
    add_run(store, "paged-not", fire_at=now)

    pages = all_pages(api, "paged", limit)

    shown = [run for page in pages for run in page]
    assert [run.id for run in shown] == oracle_order(shown)
    assert sorted(run.id for run in shown) == sorted(r.id for r in api.runs("paged", limit=99))
    assert [len(page) for page in pages[:-1]] == [limit] * (len(pages) - 1)
    assert 1 <= len(pages[-1]) <= limit


def test_runs_of_one_schedule_keep_the_order_of_the_whole_history(
    api: Schedules, store: Store
) -> None:
    """``runs(name)`` reads the history index, yet orders as ``runs()`` of all: by fire
    time, else claim time, newest first, the run ID ascending among equal times."""
    rng = random.Random(7)
    now = store.now()
    for _ in range(40):
        fire_at = None if rng.random() < 0.25 else now - timedelta(minutes=rng.randrange(8))
        claimed_at = now - timedelta(minutes=rng.randrange(8))
        state = rng.choice([RunState.SUCCEEDED, RunState.FAILED])
        add_run(store, "mixed", fire_at=fire_at, claimed_at=claimed_at, state=state)
        add_run(store, "other", fire_at=fire_at, claimed_at=claimed_at, state=state)

    def expected(state: RunState | None, since: datetime | None, limit: int) -> list[uuid.UUID]:
        kept = [
            run
            for run in api.runs(limit=200)  # every schedule's: the order of old
            if run.schedule_name == "mixed"
            and (state is None or run.state is state)
            and (since is None or (run.fire_at or run.claimed_at) >= since)
        ]
        return [run.id for run in kept[:limit]]

    for state in (None, RunState.FAILED):
        for since in (None, now - timedelta(minutes=3)):
            for limit in (1, 7, 100):
                found = api.runs("mixed", state=state, since=since, limit=limit)
                assert [run.id for run in found] == expected(state, since, limit)


def test_a_run_added_between_pages_shifts_no_page(api: Schedules, store: Store) -> None:
    now = store.now()
    for minute in range(10):
        add_run(store, "steady", fire_at=now - timedelta(minutes=minute + 1))
    first = api.run_page("steady", limit=4)
    assert first.next_before is not None

    add_run(store, "steady", fire_at=now)  # newer than every page: on the first only
    rest = all_pages_from(api, "steady", first.next_before, limit=4)

    older = [run.fire_at for run in first.runs + rest]
    assert older == [now - timedelta(minutes=minute + 1) for minute in range(10)]


def all_pages_from(api: Schedules, name: str, before: str, *, limit: int) -> list[RunRecord]:
    found: list[RunRecord] = []
    cursor: str | None = before
    while cursor is not None:
        page = api.run_page(name, before=cursor, limit=limit)
        found += page.runs
        cursor = page.next_before
    return found


def test_a_page_of_runs_reads_the_history_index_without_sorting_every_run(
    api: Schedules, store: Store
) -> None:
    now = store.now()
    for minute in range(30):
        add_run(store, "indexed", fire_at=now - timedelta(minutes=minute))
    first = api.run_page("indexed", limit=5)
    statements: list[tuple[str, Any]] = []

    def keep(conn: Any, cursor: Any, statement: str, parameters: Any, *_: Any) -> None:
        if "FROM beat_runs" in statement:
            statements.append((statement, parameters))

    event.listen(store.engine, "before_cursor_execute", keep)
    try:
        api.run_page("indexed", before=first.next_before, limit=5)
    finally:
        event.remove(store.engine, "before_cursor_execute", keep)

    (statement, parameters), *_ = statements
    with store.engine.connect() as conn:
        conn.exec_driver_sql("ANALYZE beat_runs")
        # A handful of rows: the planner would read the whole table otherwise.
        conn.exec_driver_sql("SET enable_seqscan = off")
        conn.exec_driver_sql("SET enable_bitmapscan = off")
        plan = [row[0] for row in conn.exec_driver_sql("EXPLAIN " + statement, parameters)]
    assert any("Index Scan using ix_beat_runs_schedule_name_fire_at" in line for line in plan)
    assert any("fire_at <=" in line and "Index Cond" in line for line in plan), plan
    # Within one fire time the run ID is sorted (an incremental sort); never all runs.
    assert not [
        line for line in plan if "Sort" in line and "Incremental" not in line and "Key" not in line
    ], "\n".join(plan)


def test_run_pages_refuse_a_bad_cursor_and_know_their_schedules(
    api: Schedules, store: Store
) -> None:
    create(api, "known")
    add_run(store, "removed", fire_at=store.now())  # its schedule is gone, its runs stay

    assert api.run_page("known").runs == []
    assert len(api.run_page("removed").runs) == 1
    with pytest.raises(ScheduleNotFound, match="no schedule or run history named 'nobody'"):
        api.run_page("nobody")
    not_a_time = base64.urlsafe_b64encode(b"yesterday|" + str(uuid.uuid4()).encode()).decode()
    naive = base64.urlsafe_b64encode(f"2026-01-01T00:00:00|{uuid.uuid4()}".encode()).decode()
    for cursor in ["", "!!!", "bm90IGEgY3Vyc29y", not_a_time, naive, "x" * 1000]:
        with pytest.raises(InvalidSchedule, match="start again from the newest page"):
            api.run_page("known", before=cursor)
    for limit in (0, 501, True):
        with pytest.raises(InvalidSchedule, match="limit"):
            api.run_page("known", limit=limit)


def test_a_run_gives_its_celery_task_id(api: Schedules, store: Store) -> None:
    now = store.now()
    scheduled = add_run(store, "ids", fire_at=now - timedelta(seconds=1))
    add_run(store, "ids", fire_at=now, task_id="caller-chosen-key")

    newest, older = api.run_page("ids").runs

    assert newest.task_id == "caller-chosen-key"
    assert older.task_id == str(scheduled)


def test_page_arguments_are_checked(api: Schedules) -> None:
    for offset in (-1, 1.5, True):
        with pytest.raises(InvalidSchedule, match="offset must be a whole number"):
            api.page(offset=offset)  # type: ignore[arg-type]
    with pytest.raises(InvalidSchedule, match=r"limit \(rows per page\) must be a whole number"):
        api.page(limit=501)
    with pytest.raises(InvalidSchedule, match="without NUL"):
        api.page(ScheduleFilter(search="a\x00b"))
    with pytest.raises(InvalidSchedule, match="origin must be one of"):
        api.page(ScheduleFilter(origin="code"))  # type: ignore[arg-type]


# -- run statistics -------------------------------------------------------------------


def stored_runs(store: Store) -> list[Any]:
    with store.engine.connect() as conn:
        return list(conn.execute(select(runs)))


def oracle_stats(rows: list[Any], stats: RunStats, name: str | None = None) -> dict[str, Any]:
    """Counts and lateness by bucket (``None``: the whole window) from the stored rows."""
    starts = [bucket.start for bucket in stats.buckets]
    counts: dict[int | None, dict[RunState, int]] = {}
    late: dict[int | None, list[float]] = {}
    for row in rows:
        at = row.fire_at or row.claimed_at
        if (name is not None and row.schedule_name != name) or not stats.start <= at <= stats.now:
            continue
        for key in (bisect.bisect_right(starts, at) - 1, None):
            counts.setdefault(key, dict.fromkeys(RunState, 0))[RunState(row.state)] += 1
            if row.published_at is not None and row.fire_at is not None:
                late.setdefault(key, []).append((row.published_at - row.fire_at).total_seconds())
    return {"counts": counts, "lateness": {key: percentiles(v) for key, v in late.items()}}


def percentiles(values: list[float]) -> Percentiles:
    if len(values) == 1:
        return Percentiles(p50=values[0], p95=values[0], p99=values[0], max=values[0])
    cuts = statistics.quantiles(values, n=100, method="inclusive")
    return Percentiles(p50=cuts[49], p95=cuts[94], p99=cuts[98], max=max(values))


def assert_matches(stats: RunStats, expected: dict[str, Any]) -> None:
    zero = dict.fromkeys(RunState, 0)
    for index, bucket in enumerate(stats.buckets):
        assert bucket.counts == expected["counts"].get(index, zero), bucket.start
        assert bucket.lateness == approx(expected["lateness"].get(index)), bucket.start
    assert stats.total_counts == expected["counts"].get(None, zero)
    assert stats.lateness == approx(expected["lateness"].get(None))


def approx(found: Percentiles | None) -> Any:
    """``found`` compared with a tolerance (SQL and Python interpolate in their own order)."""
    if found is None:
        return None
    fields: dict[str, Any] = {
        name: pytest.approx(getattr(found, name)) for name in ("p50", "p95", "p99", "max")
    }
    return Percentiles(**fields)


def test_run_stats_match_an_oracle_bucket_by_bucket(api: Schedules, store: Store) -> None:
    rng = random.Random(20261204)
    now = store.now()
    states = [*RunState]
    for index in range(150):
        state = rng.choice(states)
        fire_at = now - timedelta(seconds=rng.uniform(-20, 4000))  # some before the window
        late = None if rng.random() < 0.2 else rng.choice([0.002, 0.03, 0.5, 4.0]) * rng.random()
        if index % 25 == 0:
            # sent with delay(): no fire time, counted at its claim time
            add_run(store, None, fire_at=None, claimed_at=fire_at, state=state)
        else:
            name = f"s{index % 3}"
            add_run(store, name, fire_at=fire_at, state=state, late=late, claimed_at=fire_at)
    # Fired before the window, finished in it (a long task): not the window's.
    add_run(store, "s0", fire_at=now - timedelta(hours=2), finished_at=now)

    stats = api.run_stats(timedelta(hours=1), buckets=6)

    assert stats.bucket == timedelta(minutes=10)
    assert [b.start for b in stats.buckets] == [
        stats.now - timedelta(minutes=60 - 10 * index) for index in range(6)
    ]
    rows = stored_runs(store)
    assert_matches(stats, oracle_stats(rows, stats))
    assert sum(stats.total_counts.values()) > 100, "the window holds most runs"
    one = api.run_stats(timedelta(hours=1), buckets=7, schedule="s1")
    assert_matches(one, oracle_stats(rows, one, name="s1"))


def test_run_stats_buckets_are_a_minute_at_least(api: Schedules, store: Store) -> None:
    now = store.now()
    for second in (10, 70, 75, 170):
        add_run(store, "often", fire_at=now - timedelta(seconds=second), late=second / 1000)

    short = api.run_stats(timedelta(minutes=5))
    tiny = api.run_stats(timedelta(seconds=90), buckets=500, schedule="often")

    assert (short.bucket, len(short.buckets)) == (timedelta(minutes=1), 5)
    assert [bucket.total for bucket in short.buckets] == [0, 0, 1, 2, 1]
    assert short.runs_per_minute() == [0, 0, 1, 2, 1]
    assert short.buckets[3].lateness == approx(
        Percentiles(p50=0.0725, p95=0.07475, p99=0.07495, max=0.075)
    )
    assert short.buckets[0].lateness is None
    assert (tiny.bucket, len(tiny.buckets), tiny.total_counts[RunState.SUCCEEDED]) == (
        timedelta(seconds=90),
        1,
        3,
    )
    assert tiny.per_minute(3) == 2.0


def test_run_stats_arguments_and_names_are_checked(api: Schedules, store: Store) -> None:
    add_run(store, "removed", fire_at=store.now() - timedelta(minutes=2))
    assert sum(api.run_stats(timedelta(hours=1), schedule="removed").total_counts.values()) == 1
    with pytest.raises(ScheduleNotFound):
        api.run_stats(timedelta(hours=1), schedule="nobody")
    for window in (timedelta(seconds=59), timedelta(days=31, seconds=1), 3600):
        with pytest.raises(InvalidSchedule, match="window must be from 1 minute to 31 days"):
            api.run_stats(window)  # type: ignore[arg-type]
    for buckets in (0, 501):
        with pytest.raises(InvalidSchedule, match="buckets must be a whole number from 1 to 500"):
            api.run_stats(timedelta(hours=1), buckets=buckets)
