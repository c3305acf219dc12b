"""Benchmark: N schedules due at the same instant; how fast does one leader
claim and publish them? Uses a scratch database and Redis key prefix on
localhost, removed afterwards. Reports runs per second and per-batch claim
times (percentiles), never asserts.

    .venv/bin/python bench/claim_throughput.py --schedules 10000
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

import redis
from sqlalchemy import func, insert, select, text, update
from sqlalchemy.engine import make_url

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from app.factory import create_app
from app.settings import Settings
from beat.scheduler import HAScheduler
from beat.store import Store
from beat.tables import RunState, runs, schedules


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--schedules", type=int, default=10_000)
    parser.add_argument("--batch", type=int, default=1000)
    parser.add_argument(
        "--admin-url", default="postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
    )
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/15")
    options = parser.parse_args()

    suffix = uuid.uuid4().hex[:8]
    database_url = (
        make_url(options.admin_url)
        .set(database=f"habeat_bench_{suffix}")
        .render_as_string(hide_password=False)
    )
    prefix = f"habeat-bench-{suffix}"
    store = Store.connect(database_url, leader_name=prefix)
    client = redis.Redis.from_url(options.redis_url)
    scheduler = None
    try:
        store.migrate()
        make_schedules_due(store, options.schedules)
        settings = Settings(
            database_url=database_url,
            redis_url=options.redis_url,
            broker_url=options.redis_url,
            key_prefix=prefix,
            broker_key_prefix=f"{prefix}:broker:",
            claim_batch=options.batch,
        )
        scheduler = HAScheduler(app=create_app(settings))
        claim_times = instrument_claims(scheduler)
        started = time.perf_counter()
        while queued(store) < options.schedules:
            scheduler.tick()
        elapsed = time.perf_counter() - started
        report(options.schedules, options.batch, elapsed, claim_times, client, prefix)
    finally:
        if scheduler is not None:
            scheduler.close()
        store.dispose()
        drop(options.admin_url, database_url, client, prefix)
    return 0


def make_schedules_due(store: Store, count: int) -> None:
    now = datetime.now(UTC)
    rows = [
        {
            "name": f"bench-{i:07d}",
            "task": "tasks.demo.add",
            "trigger_kind": "every",
            "every_seconds": 3600.0,
            "anchor_at": now,
            "args": [i, 1],
            "next_fire_at": now,
        }
        for i in range(count)
    ]
    with store.engine.begin() as conn:
        for start in range(0, count, 5000):
            conn.execute(insert(schedules), rows[start : start + 5000])
        conn.execute(
            update(schedules).values(next_fire_at=func.now() - text("interval '1 second'"))
        )


def instrument_claims(scheduler: HAScheduler) -> list[float]:
    times: list[float] = []
    original = scheduler.store.claim_due

    def timed(*args: object, **kwargs: object) -> object:
        started = time.perf_counter()
        result = original(*args, **kwargs)  # type: ignore[arg-type]
        times.append(time.perf_counter() - started)
        return result

    scheduler.store.claim_due = timed  # type: ignore[method-assign]
    return times


def queued(store: Store) -> int:
    with store.engine.connect() as conn:
        return conn.execute(
            select(func.count()).select_from(runs).where(runs.c.state == RunState.QUEUED.value)
        ).scalar_one()


def report(
    count: int,
    batch: int,
    elapsed: float,
    claim_times: list[float],
    client: redis.Redis,
    prefix: str,
) -> None:
    in_queue = client.llen(f"{prefix}:broker:celery")
    batches = [t for t in claim_times if t > 0]
    quantiles = (
        statistics.quantiles(batches, n=100, method="inclusive")
        if len(batches) >= 2
        else batches * 99
    )
    print(f"schedules due at once: {count}")
    print(
        f"claimed and published: {in_queue} messages in the queue, {elapsed:.2f}s,"
        f" {count / elapsed:,.0f} runs/s"
    )
    print(
        f"claim transactions: {len(batches)} (batch {batch}),"
        f" p50 {quantiles[49] * 1000:.1f} ms, p99 {quantiles[98] * 1000:.1f} ms,"
        f" max {max(batches) * 1000:.1f} ms"
    )


def drop(admin_url: str, database_url: str, client: redis.Redis, prefix: str) -> None:
    keys = list(client.scan_iter(match=f"{prefix}*", count=1000))
    for start in range(0, len(keys), 1000):
        client.delete(*keys[start : start + 1000])
    client.close()
    admin = Store.connect(admin_url)
    with admin.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(
            text(f'DROP DATABASE IF EXISTS "{make_url(database_url).database}" WITH (FORCE)')
        )
    admin.dispose()


if __name__ == "__main__":
    raise SystemExit(main())
