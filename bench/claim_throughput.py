"""In-process claim and publish throughput, for profiling: N schedules overdue at
once (or all due in ``--due-in`` seconds, claimed ahead), one leader ticking until
every run is queued (no subprocess, no recorder).

    .venv/bin/python bench/claim_throughput.py --schedules 10000
    .venv/bin/python bench/claim_throughput.py --schedules 100000 --due-in 40 --profile out.prof
"""

from __future__ import annotations

import argparse
import cProfile
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sqlalchemy import func, select

from beat.config import BeatConfig
from beat.models import RunState
from beat.store.all_roles import Store
from beat.store.tables import runs
from bench.common import percentile, scratch
from bench.lateness import insert_schedules
from bench.scale import leader


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--schedules", type=int, default=10_000)
    parser.add_argument("--due-in", type=float, default=-1.0, help="seconds; <0: overdue")
    parser.add_argument(
        "--batch",
        type=int,
        default=BeatConfig().claim_batch,
        help="the claim batch (default: beat's)",
    )
    parser.add_argument("--profile", type=Path, help="write cProfile statistics here")
    options = parser.parse_args()
    profiler = cProfile.Profile() if options.profile else None
    with scratch() as run:
        # Leads before anything is due; waits as beat does (LISTEN/NOTIFY).
        scheduler = leader(run, wait=True, claim_batch=options.batch)
        first = time.time() + options.due_in
        insert_schedules(run, options.schedules, every=3600.0, first=first)
        store = run.store()
        claims: list[float] = []
        original = scheduler.store.claim_due

        def timed(*args: object, **kwargs: object) -> object:
            started = time.perf_counter()
            result = original(*args, **kwargs)  # type: ignore[arg-type]
            claims.append(time.perf_counter() - started)
            return result

        scheduler.store.claim_due = timed  # type: ignore[method-assign,assignment]
        try:
            started, cpu = time.perf_counter(), time.process_time()
            if profiler is not None:
                profiler.enable()
            while queued(store) < options.schedules:
                scheduler.tick()
            if profiler is not None:
                profiler.disable()
                profiler.dump_stats(options.profile)
            elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu
            late = lateness(store)
        finally:
            scheduler.close()
            store.dispose()
    if options.due_in >= 0:
        print(
            f"due in {options.due_in:g}s: queued (marked) after their fire time: p50"
            f" {percentile(late, 50):.3f}s, p99 {percentile(late, 99):.3f}s, max {max(late):.3f}s"
        )
    print(
        f"{options.schedules:,} schedules overdue: all queued in {elapsed:.2f}s,"
        f" {options.schedules / elapsed:,.0f} runs/s; claim transactions of {options.batch:,}:"
        f" p50 {percentile(claims, 50) * 1000:.0f} ms, p99 {percentile(claims, 99) * 1000:.0f} ms;"
        f" this process used {cpu:.2f}s of CPU ({cpu / elapsed:.0%} of the time)"
    )
    return 0


def lateness(store: Store) -> list[float]:
    """Seconds from each run's fire time to when it was marked queued (after its send)."""
    with store.engine.connect() as conn:
        return sorted(
            conn.scalars(
                select(func.extract("epoch", runs.c.published_at - runs.c.fire_at)).where(
                    runs.c.state == RunState.QUEUED.value
                )
            )
        )


def queued(store: Store) -> int:
    with store.engine.connect() as conn:
        return conn.execute(
            select(func.count()).select_from(runs).where(runs.c.state == RunState.QUEUED.value)
        ).scalar_one()


if __name__ == "__main__":
    raise SystemExit(main())
