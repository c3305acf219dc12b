"""Workers: what the guarantees cost a worker, side by side with plain Celery.

One scratch database and broker prefix; for each cell (mode, task, pool, processes)
the queue is filled first, then one real ``celery worker`` drains it. The modes:

- ``celery``: plain Celery, this package not installed (``bench.worker_plain``), the
  messages sent with ``send_task``: the baseline;
- ``plain``: plain tasks whose runs beat claimed and published, tracked by this
  package's signals (receipt, start, outcome);
- ``guarded``: the same tasks on the idempotent base, published by beat;
- ``adhoc``: the idempotent base, sent as ``.delay()`` sends it (the run row is made
  at the first delivery).

Figures per cell: tasks/s (tasks over first start → last end, from the workers' own
stamps, ``bench.worker_probe``); worker CPU per task (main and pool processes over
the drain); SQL statements per run (the workers' SQLAlchemy engines); PostgreSQL
transactions per run (``pg_stat_database``) and PostgreSQL CPU per run (the
database's backends); each with its ratio to ``celery`` at the same task, pool and
processes. A paced pass then sends ``PACED_RATE`` tasks a second to 2 prefork
processes and reports due → start lateness (p50/p99), beat's own lateness included.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import redis
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from bench.common import CLOCK_TICKS, ROOT, Process, Scratch, percentile, scratch, table, wait_for
from bench.lateness import insert_schedules
from bench.worker_plain import NOOP, SLEEP, plain_app
from bench.worker_tracked import GUARDED_NOOP, GUARDED_SLEEP

MODES = ("celery", "plain", "guarded", "adhoc")
KINDS = ("noop", "sleep")
POOLS = ("prefork", "threads")
PROCESSES = (1, 2, 4)
#: Tasks per cell: no-op tasks, and tasks that sleep 10 ms.
TASKS = {"noop": 2000, "sleep": 1000}
#: The paced pass: tasks a second, for how many seconds, on 2 prefork processes.
PACED_RATE = 50
PACED_SECONDS = 10
#: Which task each mode sends, per kind.
_TASK = {
    ("celery", "noop"): NOOP,
    ("celery", "sleep"): SLEEP,
    ("plain", "noop"): NOOP,
    ("plain", "sleep"): SLEEP,
    ("guarded", "noop"): GUARDED_NOOP,
    ("guarded", "sleep"): GUARDED_SLEEP,
    ("adhoc", "noop"): GUARDED_NOOP,
    ("adhoc", "sleep"): GUARDED_SLEEP,
}
#: Modes whose runs beat claims and publishes.
_BY_BEAT = ("plain", "guarded")


@dataclass(frozen=True, slots=True)
class Cell:
    mode: str
    kind: str
    pool: str
    processes: int
    tasks: int
    ended: int
    tasks_per_s: float
    worker_cpu_ms_per_task: float
    statements_per_run: float
    transactions_per_run: float
    postgres_cpu_ms_per_run: float
    #: Whether a worker process had imported ``beat`` (must be False for ``celery``).
    beat_imported: bool


@dataclass(frozen=True, slots=True)
class Paced:
    mode: str
    tasks: int
    started: int
    p50_ms: float
    p99_ms: float


def measure(
    modes: Sequence[str] = MODES,
    kinds: Sequence[str] = KINDS,
    pools: Sequence[str] = POOLS,
    processes: Sequence[int] = PROCESSES,
    tasks: dict[str, int] | None = None,
    *,
    paced: bool = True,
) -> tuple[list[Cell], list[Paced]]:
    sizes = tasks or TASKS
    cells: list[Cell] = []
    lateness: list[Paced] = []
    with scratch() as run:
        for kind in kinds:
            for pool in pools:
                for count in processes:
                    for mode in modes:
                        cell = measure_cell(run, mode, kind, pool, count, sizes[kind])
                        print(
                            f"  {mode:8} {kind:5} {pool:7} x{count}: {cell.tasks_per_s:7,.0f}"
                            f" tasks/s, {cell.statements_per_run:.1f} statements/run",
                            flush=True,
                        )
                        cells.append(cell)
        if paced:
            for mode in modes:
                lateness.append(measure_paced(run, mode))
                print(
                    f"  paced {mode:8}: p50 {lateness[-1].p50_ms:.0f} ms,"
                    f" p99 {lateness[-1].p99_ms:.0f} ms",
                    flush=True,
                )
    return cells, lateness


def measure_cell(run: Scratch, mode: str, kind: str, pool: str, processes: int, n: int) -> Cell:
    reset(run)
    task = _TASK[mode, kind]
    fill(run, mode, task, n)
    probe = f"{run.prefix}:probe:{mode}-{kind}-{pool}-{processes}"
    before = Server.read(run)
    worker = start_worker(run, mode, pool, processes, probe)
    try:
        # The drain is timed from the first start the probe reports.
        wait_for(lambda: Probe.read(run, probe).started > 0, timeout=120, interval=0.01)
        worker_cpu, server_cpu = tree_cpu(worker.pid), backends_cpu(run)
        started = Probe.read(run, probe).ended
        finished = wait_for(
            lambda: Probe.read(run, probe).ended >= n, timeout=120 + n * 0.1, interval=0.02
        )
        worker_cpu = tree_cpu(worker.pid) - worker_cpu
        server_cpu = backends_cpu(run) - server_cpu
    finally:
        worker.stop()
    probed = Probe.read(run, probe)
    if not finished:
        print(f"  {mode} {kind} {pool} x{processes}: {probed.ended} of {n} ended", flush=True)
    # Backends flush their statistics when they end (the worker's have).
    wait_for(lambda: Server.read(run).transactions > before.transactions, timeout=5)
    time.sleep(0.5)
    after = Server.read(run)
    drained = max(1, probed.ended - started)
    span = probed.last_end - probed.first_start
    return Cell(
        mode=mode,
        kind=kind,
        pool=pool,
        processes=processes,
        tasks=n,
        ended=probed.ended,
        tasks_per_s=probed.ended / span if span > 0 else float("nan"),
        worker_cpu_ms_per_task=worker_cpu * 1000 / drained,
        statements_per_run=probed.statements / max(1, probed.ended),
        transactions_per_run=(after.transactions - before.transactions) / max(1, probed.ended),
        postgres_cpu_ms_per_run=server_cpu * 1000 / drained,
        beat_imported=probed.beat_imported,
    )


def measure_paced(run: Scratch, mode: str) -> Paced:
    """``PACED_RATE`` no-op tasks a second for ``PACED_SECONDS`` to 2 prefork processes,
    each due at its own instant: how late each started."""
    reset(run)
    task = _TASK[mode, "noop"]
    n = PACED_RATE * PACED_SECONDS
    probe = f"{run.prefix}:probe:paced-{mode}"
    worker = start_worker(run, mode, "prefork", 2, probe)
    beat: Process | None = None
    try:
        # The worker's start, and the beat's start and first claim, come before it.
        first = time.time() + 15
        if mode in _BY_BEAT:
            insert_staggered(run, task, n, first)
            beat = start_beat(run)
        else:
            producer = plain_app(run.redis_url, run.broker_prefix)
            for i in range(n):
                due = first + i / PACED_RATE
                time.sleep(max(0.0, due - time.time()))
                producer.send_task(task, args=[i], kwargs={"due": due})
            producer.close()
        wait_for(lambda: Probe.read(run, probe).ended >= n, timeout=first - time.time() + 60)
    finally:
        if beat is not None:
            beat.stop()
        worker.stop()
    late = sorted(Probe.read(run, probe).due_to_start)
    return Paced(
        mode=mode,
        tasks=n,
        started=len(late),
        p50_ms=percentile(late, 50) * 1000,
        p99_ms=percentile(late, 99) * 1000,
    )


def reset(run: Scratch) -> None:
    """An empty queue and run table for the next cell."""
    run.execute("TRUNCATE beat_runs, beat_schedules CASCADE")
    run.clear_redis()


def fill(run: Scratch, mode: str, task: str, n: int) -> None:
    """``n`` messages of ``task`` in the queue, as ``mode`` sends them; no worker yet."""
    client = redis.Redis.from_url(run.redis_url)
    try:
        if mode in _BY_BEAT:
            insert_schedules(run, n, every=86_400, first=time.time(), task=task)
            beat = start_beat(run)
            try:
                wait_for(lambda: client.llen(run.queue_key) >= n, timeout=120 + n / 100)
            finally:
                beat.stop()
        else:
            producer = plain_app(run.redis_url, run.broker_prefix)
            with producer.producer_or_acquire() as publisher:
                for i in range(n):
                    producer.send_task(task, args=[i], producer=publisher)
            producer.close()
        queued = int(client.llen(run.queue_key))
    finally:
        client.close()
    if queued != n:
        raise RuntimeError(f"{mode}: {queued} of {n} messages queued")


def insert_staggered(run: Scratch, task: str, n: int, first: float) -> None:
    """``n`` schedules of ``task``, the i-th first due ``i / PACED_RATE`` s after ``first``
    (interval schedules of a day: each fires once in the pass)."""
    run.execute(
        "INSERT INTO beat_schedules (name, task, trigger_kind, every_seconds, anchor_at,"
        " next_fire_at, args)"
        " SELECT 'paced-' || lpad(i::text, 7, '0'), :task, 'every', 86400,"
        " to_timestamp(:first + i::float8 / :rate), to_timestamp(:first + i::float8 / :rate),"
        " jsonb_build_array(i) FROM generate_series(0, :n - 1) AS i",
        {"task": task, "n": n, "first": first, "rate": PACED_RATE},
    )


def tracked_env(run: Scratch, **extra: str) -> dict[str, str]:
    return run.env(HABEAT_IMPORTS="bench.worker_tracked", **extra)


def start_beat(run: Scratch) -> Process:
    return Process.start(
        "beat", ["-A", "app", "beat", "-l", "warning"], tracked_env(run), run.workdir
    )


def start_worker(run: Scratch, mode: str, pool: str, processes: int, probe: str) -> Process:
    env = tracked_env(run, BENCH_PROBE_KEY=probe)
    name = f"worker-{mode}-{pool}-{processes}"
    if mode == "celery":
        return start_plain_worker(run, name, pool, processes, env)
    args = ["-A", "app", "worker", "-l", "warning", "-P", pool, "-c", str(processes)]
    args += ["--without-gossip", "--without-mingle", "--without-heartbeat"]
    return Process.start(name, args, env, run.workdir)


def start_plain_worker(
    run: Scratch, name: str, pool: str, processes: int, env: dict[str, str]
) -> Process:
    """The baseline's worker, with the options of the others, outside the ``celery``
    command (see ``bench.worker_plain``)."""
    log = run.workdir / f"{name}.log"
    with log.open("ab") as handle:
        popen = subprocess.Popen(
            [sys.executable, "-m", "bench.worker_plain", pool, str(processes)],
            cwd=ROOT,
            env=env,
            stdout=handle,
            stderr=subprocess.STDOUT,
        )
    return Process(name=name, popen=popen, log=log)


@dataclass(frozen=True, slots=True)
class Probe:
    """What the worker processes reported (``bench.worker_probe``), summed."""

    started: int
    ended: int
    first_start: float
    last_end: float
    statements: int
    due_to_start: list[float]
    beat_imported: bool

    @classmethod
    def read(cls, run: Scratch, key: str) -> Probe:
        client = redis.Redis.from_url(run.redis_url)
        try:
            found = [json.loads(raw) for raw in client.hvals(key)]
        finally:
            client.close()
        firsts = [p["first_start"] for p in found if p["first_start"] is not None]
        lasts = [p["last_end"] for p in found if p["last_end"] is not None]
        return cls(
            started=sum(p["started"] for p in found),
            ended=sum(p["ended"] for p in found),
            first_start=min(firsts, default=float("nan")),
            last_end=max(lasts, default=float("nan")),
            statements=sum(p["statements"] for p in found),
            due_to_start=[late for p in found for late in p["due_to_start"]],
            beat_imported=any(p["beat_imported"] for p in found),
        )


@dataclass(frozen=True, slots=True)
class Server:
    """The scratch database's committed and rolled back transactions so far."""

    transactions: int

    @classmethod
    def read(cls, run: Scratch) -> Server:
        return cls(transactions=int(_scalar(run, _TRANSACTIONS)))


_TRANSACTIONS = (
    "SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = current_database()"
)
_BACKENDS = (
    "SELECT pid FROM pg_stat_activity WHERE datname = current_database()"
    " AND pid <> pg_backend_pid()"
)


def _scalar(run: Scratch, sql: str) -> Any:
    return _rows(run, sql)[0][0]


def _rows(run: Scratch, sql: str) -> list[Any]:
    engine = create_engine(make_url(run.database_url), isolation_level="AUTOCOMMIT")
    try:
        with engine.connect() as conn:
            conn.execute(text("SELECT pg_stat_clear_snapshot()"))
            return list(conn.execute(text(sql)))
    finally:
        engine.dispose()


def backends_cpu(run: Scratch) -> float:
    """CPU seconds the scratch database's backends used so far (those alive now)."""
    return sum(_cpu(pid) for (pid,) in _rows(run, _BACKENDS))


def tree_cpu(pid: int) -> float:
    """CPU seconds of a process and its children (a prefork worker's pool)."""
    children = [
        int(stat.parent.name) for stat in Path("/proc").glob("[0-9]*/stat") if _parent(stat) == pid
    ]
    return _cpu(pid) + sum(_cpu(child) for child in children)


def _parent(stat: Path) -> int | None:
    try:
        return int(stat.read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def _cpu(pid: int) -> float:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def report(cells: list[Cell], paced: list[Paced]) -> dict[str, Any]:
    """Print the tables; the document of every figure, ratios to ``celery`` beside them."""
    baseline = {(c.kind, c.pool, c.processes): c for c in cells if c.mode == "celery"}
    headers = ["mode", "task", "pool", "procs", "tasks/s", "vs celery", "worker CPU ms/task"]
    headers += ["statements/run", "PG transactions/run", "PG CPU ms/run"]
    rows = []
    documents = []
    for cell in cells:
        base = baseline.get((cell.kind, cell.pool, cell.processes))
        ratio = cell.tasks_per_s / base.tasks_per_s if base else float("nan")
        cpu_ratio = (
            cell.worker_cpu_ms_per_task / base.worker_cpu_ms_per_task if base else float("nan")
        )
        rows.append(
            [
                cell.mode,
                cell.kind,
                cell.pool,
                cell.processes,
                f"{cell.tasks_per_s:,.0f}",
                f"{ratio:.2f}x",
                f"{cell.worker_cpu_ms_per_task:.2f}",
                f"{cell.statements_per_run:.1f}",
                f"{cell.transactions_per_run:.1f}",
                f"{cell.postgres_cpu_ms_per_run:.2f}",
            ]
        )
        documents.append(asdict(cell) | {"tasks_per_s_ratio": ratio, "worker_cpu_ratio": cpu_ratio})
    print(table(headers, rows))
    if any(cell.mode == "celery" and cell.beat_imported for cell in cells):
        print("\nwarning: a baseline worker imported beat: its figures are not plain Celery's")
    if paced:
        print(
            f"\ndue → start, {PACED_RATE} no-op tasks/s for {PACED_SECONDS} s,"
            " 2 prefork processes\n"
        )
        print(
            table(
                ["mode", "tasks", "started", "p50 ms", "p99 ms"],
                [[p.mode, p.tasks, p.started, f"{p.p50_ms:.0f}", f"{p.p99_ms:.0f}"] for p in paced],
            )
        )
    return {"cells": documents, "paced": [asdict(p) for p in paced]}
