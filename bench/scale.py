"""Scale: does a tick cost the same with 1,000 schedules due among 10,000 stored
as among 1,000,000? The leader's queries must touch what is due, not what is stored.

In process (no subprocess): one leader ticks against a scratch database holding
N schedules due in a day or later; each repetition makes 1,000 of them due and
times one whole tick (outbox, reaper, claim, publish; the wait left out). An idle
tick (nothing due) is timed too.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import redis

from app.factory import create_app
from app.settings import Settings
from beat.scheduler import HAScheduler
from bench.common import TASK, Scratch, percentile, scratch, table

DUE = 1000
REPEATS = 15


@dataclass(frozen=True, slots=True)
class TickCost:
    stored: int
    due: int
    due_p50_ms: float
    due_p99_ms: float
    idle_p50_ms: float
    idle_p99_ms: float


def measure(stored_sizes: list[int]) -> list[TickCost]:
    return [measure_one(stored) for stored in stored_sizes]


def measure_one(stored: int) -> TickCost:
    with scratch() as run:
        fill(run, stored)
        scheduler = leader(run)
        broker = redis.Redis.from_url(run.redis_url)
        try:
            idle, due = [], []
            for repeat in range(REPEATS):
                idle.append(timed_tick(scheduler))
                make_due(run, first_id=1 + repeat * DUE)
                due.append(timed_tick(scheduler))
                broker.delete(run.queue_key)
        finally:
            scheduler.close()
            broker.close()
    cost = TickCost(
        stored=stored,
        due=DUE,
        due_p50_ms=percentile(due, 50) * 1000,
        due_p99_ms=percentile(due, 99) * 1000,
        idle_p50_ms=percentile(idle, 50) * 1000,
        idle_p99_ms=percentile(idle, 99) * 1000,
    )
    print(f"  {stored:>9,} stored: {cost}", flush=True)
    return cost


def fill(run: Scratch, stored: int) -> None:
    """``stored`` hourly schedules, none due for a day or more, then ANALYZE."""
    run.execute(
        "INSERT INTO beat_schedules (name, task, trigger_kind, every_seconds,"
        " anchor_at, next_fire_at, args)"
        " SELECT 'bench-' || lpad(i::text, 8, '0'), :task, 'every', 3600, now(),"
        " now() + interval '1 day' + i * interval '1 second',"
        " jsonb_build_array(i) FROM generate_series(1, :stored) AS i",
        {"task": TASK, "stored": stored},
    )
    run.execute("VACUUM ANALYZE beat_schedules", isolation_level="AUTOCOMMIT")


def make_due(run: Scratch, first_id: int) -> None:
    run.execute(
        "UPDATE beat_schedules SET next_fire_at = now() - interval '1 second'"
        " WHERE id >= :first AND id < :first + :due",
        {"first": first_id, "due": DUE},
    )


def leader(run: Scratch, *, wait: bool = False, claim_batch: int = DUE) -> HAScheduler:
    """A scheduler that leads, claiming ``claim_batch`` schedules at a time (all of a
    tick's by default); it never waits unless ``wait`` (then as beat does)."""
    settings = Settings(
        database_url=run.database_url,
        redis_url=run.redis_url,
        broker_url=run.redis_url,
        key_prefix=run.prefix,
        broker_key_prefix=run.broker_prefix,
        claim_batch=claim_batch,
    )
    scheduler = HAScheduler(app=create_app(settings))
    if not wait:
        scheduler.loop.waiter = _NoWait()  # time the work only
    timed_tick(scheduler)  # takes the lease, syncs code schedules, warms the pools
    if scheduler.epoch is None:
        raise RuntimeError("the benchmark's scheduler did not become leader")
    return scheduler


def timed_tick(scheduler: HAScheduler) -> float:
    started = time.perf_counter()
    scheduler.tick()
    return time.perf_counter() - started


def report(costs: list[TickCost]) -> list[dict[str, Any]]:
    base = costs[0]
    rows = [
        [
            f"{c.stored:,}",
            f"{c.due:,}",
            f"{c.due_p50_ms:.1f}",
            f"{c.due_p99_ms:.1f}",
            f"{c.due_p50_ms / base.due_p50_ms:.2f}x",
            f"{c.idle_p50_ms:.2f}",
            f"{c.idle_p50_ms / base.idle_p50_ms:.2f}x",
        ]
        for c in costs
    ]
    headers = ["stored", "due", "tick p50 ms", "tick p99 ms", "vs smallest", "idle tick ms", "vs"]
    print(table(headers, rows), flush=True)
    return [vars_of(c) for c in costs]


def vars_of(cost: TickCost) -> dict[str, Any]:
    return {name: getattr(cost, name) for name in cost.__slots__}


class _NoWait:
    """A waiter that returns at once: the benchmark times the work, not the waits."""

    def listen(self) -> None:
        pass

    def wait(self, timeout: float) -> bool:
        return False
