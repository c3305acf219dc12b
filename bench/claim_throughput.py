"""In-process claim and publish throughput, for profiling: N schedules overdue at
once, one leader ticking until every run is queued (no subprocess, no recorder).

    .venv/bin/python bench/claim_throughput.py --schedules 10000
    .venv/bin/pyinstrument bench/claim_throughput.py --schedules 10000
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sqlalchemy import func, select

from beat.models import RunState
from beat.store import Store
from beat.tables import runs
from bench.common import percentile, scratch
from bench.lateness import insert_schedules
from bench.scale import leader


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--schedules", type=int, default=10_000)
    options = parser.parse_args()
    with scratch() as run:
        scheduler = leader(run)  # leads before anything is due
        insert_schedules(run, options.schedules, every=3600.0, first=time.time() - 1)
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
            while queued(store) < options.schedules:
                scheduler.tick()
            elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu
        finally:
            scheduler.close()
            store.dispose()
    print(
        f"{options.schedules:,} schedules overdue: all queued in {elapsed:.2f}s,"
        f" {options.schedules / elapsed:,.0f} runs/s; claim transactions of 1,000:"
        f" p50 {percentile(claims, 50) * 1000:.0f} ms, p99 {percentile(claims, 99) * 1000:.0f} ms;"
        f" this process used {cpu:.2f}s of CPU ({cpu / elapsed:.0%} of the time)"
    )
    return 0


def queued(store: Store) -> int:
    with store.engine.connect() as conn:
        return conn.execute(
            select(func.count()).select_from(runs).where(runs.c.state == RunState.QUEUED.value)
        ).scalar_one()


if __name__ == "__main__":
    raise SystemExit(main())
