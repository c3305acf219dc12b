"""Reclaim: a worker is SIGKILLed in the middle of a run; how long until the run
starts again on another worker, and until it completes there?

One beat (its leader runs the reaper), two workers, HABEAT_LEASE_TIMEOUT=LEASE.
Times come from PostgreSQL's clock: the kill is stamped with ``now()``; the
restart is the second attempt's ``started_at``; completion is ``finished_at``.
"""

from __future__ import annotations

import signal
import time
import uuid
from dataclasses import dataclass
from typing import Any

from sqlalchemy import text

from beat.ops.schedules import Schedules
from beat.store.all_roles import Store
from bench.common import Process, Scratch, percentile, scratch, table, wait_for

LEASE = 10.0
JOB_SECONDS = 6.0
REPEATS = 3


@dataclass(frozen=True, slots=True)
class Reclaim:
    lease_s: float
    restarted_s: list[float]
    completed_s: list[float]
    attempts: list[int]


def measure() -> Reclaim:
    with scratch() as run:
        env = run.env(HABEAT_IMPORTS="bench.jobs", HABEAT_LEASE_TIMEOUT=f"{LEASE:g}")
        beat = Process.start("beat", ["-A", "app", "beat", "-l", "info"], env, run.workdir)
        workers = {name: start_worker(run, name, env) for name in ("w1", "w2")}
        store = run.store()
        restarted, completed, attempts = [], [], []
        try:
            for repeat in range(REPEATS):
                run_id = start_job(store, f"reclaim-{repeat}")
                row = wait_for_row(store, run_id, "running", timeout=60)
                time.sleep(1.0)  # well inside the job
                victim = row.worker.split("@")[0]
                workers[victim].kill(signal.SIGKILL)
                killed_at = db_now(store)
                done = wait_for_row(store, run_id, "succeeded", timeout=LEASE * 3 + 30)
                restarted.append((done.started_at - killed_at).total_seconds())
                completed.append((done.finished_at - killed_at).total_seconds())
                attempts.append(done.attempt)
                print(
                    f"  kill {repeat + 1}: restarted after {restarted[-1]:.2f}s,"
                    f" completed after {completed[-1]:.2f}s (attempt {done.attempt})",
                    flush=True,
                )
                workers[victim] = start_worker(run, victim, env)
        finally:
            for process in (beat, *workers.values()):
                process.stop()
            store.dispose()
    return Reclaim(lease_s=LEASE, restarted_s=restarted, completed_s=completed, attempts=attempts)


def start_worker(run: Scratch, name: str, env: dict[str, str]) -> Process:
    args = ["-A", "app", "worker", "-l", "info", "-P", "threads", "-c", "2", "-n", f"{name}@%h"]
    args += ["--without-gossip", "--without-mingle"]
    return Process.start(name, args, env, run.workdir)


def start_job(store: Store, name: str) -> uuid.UUID:
    """A one-off schedule of the slow job, due now; returns its run's ID once claimed."""
    Schedules(store).create(
        name, "bench.slow", in_seconds=0, kwargs={"seconds": JOB_SECONDS}, allow_unregistered=True
    )
    found: list[uuid.UUID] = []

    def claimed() -> bool:
        rows = Schedules(store).runs(name, limit=1)
        found.extend(row.id for row in rows)
        return bool(rows)

    if not wait_for(claimed, timeout=30):
        raise RuntimeError(f"schedule {name} was not claimed: see the beat log")
    return found[0]


def wait_for_row(store: Store, run_id: uuid.UUID, state: str, timeout: float) -> Any:
    found: list[Any] = []

    def reached() -> bool:
        with store.engine.connect() as conn:
            row = conn.execute(
                text("SELECT * FROM beat_runs WHERE id = :id AND state = :state"),
                {"id": run_id, "state": state},
            ).one_or_none()
        found.append(row)
        return row is not None

    if not wait_for(reached, timeout=timeout, interval=0.05):
        raise RuntimeError(f"run {run_id} did not reach {state} within {timeout:.0f}s")
    return found[-1]


def db_now(store: Store) -> Any:
    with store.engine.connect() as conn:
        return conn.execute(text("SELECT now()")).scalar_one()


def report(result: Reclaim) -> dict[str, Any]:
    rows = [
        [
            f"{result.lease_s:g}",
            len(result.restarted_s),
            f"{percentile(result.restarted_s, 50):.2f}",
            f"{max(result.restarted_s):.2f}",
            f"{result.lease_s + 2:g}",
            f"{percentile(result.completed_s, 50):.2f}",
            f"{JOB_SECONDS:g}",
        ]
    ]
    headers = [
        "lease s",
        "kills",
        "restarted after s (p50)",
        "max",
        "target s",
        "completed after s (p50)",
        "job s",
    ]
    print(table(headers, rows), flush=True)
    return {name: getattr(result, name) for name in result.__slots__}
