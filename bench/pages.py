"""Pages: what the reads of the schedules web UI cost at 100,000 schedules and
10,000,000 runs (``--schedules``, ``--runs`` to try it small).

In process: a database of its own (``habeat_bench_pages``, dropped at the end unless
``--keep``; kept, it is used again when it holds the sizes asked) is filled with
set-based SQL, the indexes in place, then vacuumed and analysed. The runs spread
evenly over the last 7 days, in time order as a cluster writes them, over the
schedules with a skew (the busiest has about one in 46 runs, the median schedule
about one in 10,000 of them); about 1% failed, 0.2% lost, 0.8% skipped, the newest 2%
not finished; lateness a few milliseconds, seconds for 1% of them. Then each facade
read a page makes is timed ``--repeats`` times, after one untimed call. Then the
finished runs are summarised as the leader does it (passes of ``SUMMARY_BUDGET``
seconds until caught up: the catch-up of a database that already holds them, timed)
and the statistics of all schedules, which then read the summary, are timed again.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import timedelta
from typing import Any

import psycopg
from sqlalchemy import text
from sqlalchemy.engine import make_url

from beat.config import BeatConfig
from beat.leader.maintenance import SUMMARY_BUDGET
from beat.ops.schedules import ScheduleFilter, Schedules
from beat.store.all_roles import Store
from beat.store.history import RunCursor
from beat.store.leader import LeaderStore
from beat.ui.server import BackgroundUI, UISettings
from bench.common import ADMIN_URL, REDIS_URL, percentile, table
from bench.ui_http import page_reads

DATABASE = "habeat_bench_pages"
SCHEDULES = 100_000
RUNS = 10_000_000
REPEATS = 20
#: Rows of the pages read (the UI's default).
PAGE = 50
#: Runs inserted by one statement: big statements, and a line of progress each.
CHUNK = 1_000_000
#: The busiest schedule: the skew gives the lowest numbers the most runs.
BUSIEST = "bench-000001"


@dataclass(frozen=True, slots=True)
class Fill:
    schedules: int
    runs: int
    schedules_s: float
    runs_s: float
    vacuum_analyze_s: float
    runs_table_mib: float
    runs_indexes_mib: float
    reused: bool


@dataclass(frozen=True, slots=True)
class Read:
    name: str
    p50_ms: float
    p95_ms: float
    max_ms: float
    #: What the read returned (rows of a page, runs counted by statistics): a sanity check.
    returned: int


def measure(schedules: int, runs: int, *, repeats: int, keep: bool) -> tuple[Fill, list[Read]]:
    url = database_url()
    fill = prepare(url, schedules, runs)
    store = Store.connect(url)
    try:
        api = Schedules(store)
        reads = [timed(name, read, repeats) for name, read in reads_of(api, store)]
        reads.append(catch_up(store))
        reads += [
            timed(f"{name} (summary)", read, repeats)
            for name, read in reads_of(api, store)
            if name.startswith("run_stats()") and BUSIEST not in name
        ]
        reads += timed_pages(store, repeats)
    finally:
        store.dispose()
        if not keep:
            drop_database()
    return fill, reads


def timed_pages(store: Store, repeats: int) -> list[Read]:
    """The UI's pages over HTTP (``bench.ui_http``): the reads above, rendered."""
    config = BeatConfig(
        database_url=database_url(), redis_url=REDIS_URL, key_prefix=f"{DATABASE}-ui"
    )
    api = Schedules(store, config=config)
    total = api.page(limit=1).total
    with BackgroundUI(api, UISettings(port=0)) as ui:
        reads = page_reads(
            ui.url,
            busiest=BUSIEST,
            quiet=quiet(total),
            deep_cursor=deep_cursor(store, BUSIEST, PAGE),
        )
        return [timed(name, read, repeats) for name, read in reads]


def catch_up(store: Store) -> Read:
    """Summarise every settled minute as the leader would: passes of ``SUMMARY_BUDGET``."""
    leader = LeaderStore(store.engine)
    passes = summarised = 0
    started = time.perf_counter()
    while True:
        report = leader.summarise(budget=SUMMARY_BUDGET)
        passes, summarised = passes + 1, summarised + report.runs
        if report.caught_up:
            break
    ms = (time.perf_counter() - started) * 1000
    name = f"summarise() catch-up, {passes} passes"
    print(f"  {name}: {ms / 1000:,.1f} s for {summarised:,} runs", flush=True)
    return Read(name=name, p50_ms=ms, p95_ms=ms, max_ms=ms, returned=summarised)


def database_url() -> str:
    return make_url(ADMIN_URL).set(database=DATABASE).render_as_string(hide_password=False)


def conninfo(url: str) -> str:
    """A SQLAlchemy URL as psycopg's connection string (the fill uses psycopg alone)."""
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


def drop_database() -> None:
    with psycopg.connect(conninfo(ADMIN_URL), autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{DATABASE}" WITH (FORCE)')


# -- the fill -------------------------------------------------------------------------


def prepare(url: str, schedules: int, runs: int) -> Fill:
    """The database filled with ``schedules`` and ``runs``: a kept one that holds them
    is used as it is (migrated to the newest schema); anything else is made afresh."""
    if stored_sizes(url) == (schedules, runs):
        migrate(url)
        print(f"  using the kept database {DATABASE}, {newest_run_age(url)}", flush=True)
        return Fill(schedules, runs, 0.0, 0.0, 0.0, *sizes_mib(url), reused=True)
    drop_database()
    migrate(url)
    with psycopg.connect(conninfo(url)) as conn:
        schedules_s = timed_once(lambda: fill_schedules(conn, schedules))
        print(f"  {schedules:,} schedules in {schedules_s:.1f}s", flush=True)
        runs_s = timed_once(lambda: fill_runs(conn, schedules, runs))
        print(f"  {runs:,} runs in {runs_s:.1f}s", flush=True)
        conn.autocommit = True
        vacuum_s = timed_once(lambda: conn.execute("VACUUM ANALYZE beat_schedules, beat_runs"))
        print(f"  VACUUM ANALYZE in {vacuum_s:.1f}s", flush=True)
    return Fill(schedules, runs, schedules_s, runs_s, vacuum_s, *sizes_mib(url), reused=False)


def migrate(url: str) -> None:
    store = Store.connect(url)
    try:
        store.migrate()
    finally:
        store.dispose()


def newest_run_age(url: str) -> str:
    """How long ago the newest run fired: the windows of the statistics hold fewer runs
    as a kept database ages."""
    with psycopg.connect(conninfo(url)) as conn:
        row = conn.execute("SELECT now() - max(fire_at) FROM beat_runs").fetchone()
    return f"its newest run fired {row[0] if row else None} ago"


def stored_sizes(url: str) -> tuple[int, int] | None:
    """How many schedules and runs a kept database holds; None if there is none."""
    try:
        with psycopg.connect(conninfo(url), connect_timeout=3) as conn:
            row = conn.execute(
                "SELECT (SELECT count(*) FROM beat_schedules), (SELECT count(*) FROM beat_runs)"
            ).fetchone()
    except psycopg.Error:
        return None
    return None if row is None else (int(row[0]), int(row[1]))


def sizes_mib(url: str) -> tuple[float, float]:
    with psycopg.connect(conninfo(url)) as conn:
        row = conn.execute(
            "SELECT pg_table_size('beat_runs'), pg_indexes_size('beat_runs')"
        ).fetchone()
    assert row is not None
    return row[0] / 2**20, row[1] / 2**20


def fill_schedules(conn: psycopg.Connection[Any], count: int) -> None:
    """Interval schedules ``bench-000001`` ...: 5% paused, 10% defined in code, 50 tasks."""
    conn.execute(
        "INSERT INTO beat_schedules (name, task, trigger_kind, every_seconds, anchor_at,"
        " next_fire_at, enabled, origin)"
        " SELECT 'bench-' || lpad(i::text, 6, '0'), 'bench.task_' || (i %% 50), 'every', 600,"
        " now(), now() + interval '1 day', i %% 20 <> 0,"
        " CASE WHEN i %% 10 = 0 THEN 'code' ELSE 'api' END"
        " FROM generate_series(1, %(count)s) AS i",
        {"count": count},
    )
    conn.commit()


def fill_runs(conn: psycopg.Connection[Any], schedules: int, count: int) -> None:
    """``count`` runs over the last 7 days, oldest first, ``CHUNK`` per statement."""
    # The references are right by construction: no per-row foreign-key trigger (the
    # session's replication role skips them; it needs a superuser, else they run).
    try:
        conn.execute("SET session_replication_role = replica")
    except psycopg.errors.InsufficientPrivilege:
        conn.rollback()
    started = time.perf_counter()
    for first in range(1, count + 1, CHUNK):
        last = min(count, first + CHUNK - 1)
        conn.execute(
            RUNS_SQL,
            {"first": first, "last": last, "count": count, "schedules": schedules},
        )
        conn.commit()
        print(f"    {last:,} runs, {time.perf_counter() - started:.0f}s", flush=True)


# Run ``i`` of ``count`` fires at ``now - 7 days + i * 7 days / count``: every fire time
# differs, so (schedule, fire time) stays unique whatever the schedule drawn. The IDs
# ascend as the runs were written (random UUIDs would make the fill much slower, and
# no read measured here looks runs up by ID).
RUNS_SQL = """
INSERT INTO beat_runs (id, schedule_id, schedule_name, task, fire_at, state, epoch, attempt,
    claimed_at, published_at, started_at, finished_at, duration_seconds, worker, error)
SELECT id, s, 'bench-' || lpad(s::text, 6, '0'), 'bench.task_' || (s %% 50), fire_at, state, 1,
    CASE WHEN state IN ('pending', 'queued', 'skipped') THEN 0 ELSE 1 END,
    fire_at - ahead,
    CASE WHEN state NOT IN ('pending', 'skipped') THEN fire_at + late END,
    CASE WHEN state NOT IN ('pending', 'queued', 'skipped') THEN fire_at + late END,
    CASE WHEN state = 'skipped' THEN fire_at - ahead
         WHEN state NOT IN ('pending', 'queued', 'running', 'retrying')
         THEN fire_at + late + took END,
    CASE WHEN state IN ('succeeded', 'failed', 'lost') THEN extract(epoch FROM took) END,
    CASE WHEN state NOT IN ('pending', 'queued', 'skipped') THEN 'w' || (s %% 8) || '@bench' END,
    CASE state WHEN 'failed' THEN 'RuntimeError: boom' WHEN 'lost' THEN 'worker lost' END
FROM (
    SELECT id, s, fire_at, ahead, late, took,
        CASE WHEN newest THEN (ARRAY['pending', 'queued', 'queued', 'queued', 'running',
                                     'running', 'retrying'])[1 + floor(u * 7)::int]
             WHEN u < 0.010 THEN 'failed'
             WHEN u < 0.012 THEN 'lost'
             WHEN u < 0.020 THEN 'skipped'
             ELSE 'succeeded' END AS state
    FROM (
        SELECT ('00000000-0000-4000-8000-' || lpad(to_hex(i), 12, '0'))::uuid AS id,
            1 + floor(%(schedules)s * power(random(), 3))::int AS s,
            now() - interval '7 days' + (i - 1) * (interval '7 days' / %(count)s) AS fire_at,
            i > %(count)s * 0.98 AS newest,
            random() AS u,
            random() * interval '3 seconds' AS ahead,
            make_interval(secs => 0.002 + 0.03 * -ln(1 - random())
                + CASE WHEN random() < 0.01 THEN 3 * random() ELSE 0 END) AS late,
            make_interval(secs => 0.01 + 2 * random() * random()) AS took
        FROM generate_series(%(first)s, %(last)s) AS i
    ) AS drawn
) AS run
"""


# -- the reads ------------------------------------------------------------------------


Reader = Callable[[], int]


def reads_of(api: Schedules, store: Store) -> list[tuple[str, Reader]]:
    """Each read a page makes, as (name, call returning how many rows it got)."""
    total = api.page(limit=1).total
    deep = deep_cursor(store, BUSIEST, PAGE)

    def page(where: ScheduleFilter | None = None, offset: int = 0) -> Reader:
        chosen = where or ScheduleFilter()
        return lambda: len(api.page(chosen, offset=offset, limit=PAGE).rows)

    def stats(window: timedelta, schedule: str | None = None) -> Reader:
        return lambda: sum(api.run_stats(window, schedule=schedule).total_counts.values())

    return [
        ("page() first page", page()),
        ("page() last page", page(offset=max(0, total - PAGE))),
        ("page() search, a few match", page(ScheduleFilter(search="-00042"))),
        ("page() search, none match", page(ScheduleFilter(search="no such"))),
        ("page() paused", page(ScheduleFilter(paused=True))),
        ("page() failing", page(ScheduleFilter(failing=True))),
        ("page() failing + search", page(ScheduleFilter(failing=True, search="-0004"))),
        (f"details() of {BUSIEST}", lambda: len(api.details(BUSIEST).recent_runs)),
        ("details() of a quiet schedule", lambda: len(api.details(quiet(total)).recent_runs)),
        ("run_page() first page", lambda: len(api.run_page(BUSIEST, limit=PAGE).runs)),
        ("run_page() last page", lambda: len(api.run_page(BUSIEST, before=deep).runs)),
        ("run_stats() 1 h", stats(timedelta(hours=1))),
        ("run_stats() 24 h", stats(timedelta(hours=24))),
        ("run_stats() 7 d", stats(timedelta(days=7))),
        (f"run_stats() 7 d of {BUSIEST}", stats(timedelta(days=7), BUSIEST)),
    ]


def quiet(total: int) -> str:
    """A schedule near the end of the skew: a handful of runs."""
    return f"bench-{max(1, total - 7):06d}"


def deep_cursor(store: Store, name: str, page: int) -> str | None:
    """The cursor of the last page of ``name``'s runs."""
    with store.engine.connect() as conn:
        row = conn.execute(
            text(
                "SELECT fire_at, id FROM beat_runs WHERE schedule_name = :name"
                " ORDER BY fire_at DESC, id DESC"
                " OFFSET greatest(0, (SELECT count(*) FROM beat_runs"
                " WHERE schedule_name = :name) - :page - 1) LIMIT 1"
            ),
            {"name": name, "page": page},
        ).one_or_none()
    return None if row is None else RunCursor(fire_at=row.fire_at, id=row.id).encode()


def timed(name: str, read: Reader, repeats: int) -> Read:
    returned = read()  # untimed: the pool's connections, the caches
    seconds = [timed_once(read) for _ in range(repeats)]
    result = Read(
        name=name,
        p50_ms=percentile(seconds, 50) * 1000,
        p95_ms=percentile(seconds, 95) * 1000,
        max_ms=max(seconds) * 1000,
        returned=returned,
    )
    print(f"  {name}: p50 {result.p50_ms:,.1f} ms", flush=True)
    return result


def timed_once(call: Callable[[], object]) -> float:
    started = time.perf_counter()
    call()
    return time.perf_counter() - started


# -- the report -----------------------------------------------------------------------


def report(fill: Fill, reads: list[Read]) -> dict[str, Any]:
    if fill.reused:
        print(f"\nkept database: {fill.schedules:,} schedules, {fill.runs:,} runs")
    else:
        print(
            f"\nfill: {fill.schedules:,} schedules in {fill.schedules_s:.1f}s,"
            f" {fill.runs:,} runs in {fill.runs_s:.1f}s"
            f" ({fill.runs / max(fill.runs_s, 1e-9):,.0f} runs/s),"
            f" VACUUM ANALYZE in {fill.vacuum_analyze_s:.1f}s"
        )
    print(
        f"beat_runs: table {fill.runs_table_mib:,.0f} MiB,"
        f" indexes {fill.runs_indexes_mib:,.0f} MiB\n"
    )
    rows = [
        [r.name, f"{r.p50_ms:,.1f}", f"{r.p95_ms:,.1f}", f"{r.max_ms:,.1f}", f"{r.returned:,}"]
        for r in reads
    ]
    print(table(["read", "p50 ms", "p95 ms", "max ms", "rows, runs or bytes"], rows), flush=True)
    return {"fill": asdict(fill), "reads": [asdict(r) for r in reads]}
