"""Failover: 1-second schedules, three of our beat processes (two of RedBeat's; Celery's
own beat has no failover to measure); SIGKILL the leader, then SIGTERM the next one.

From the recorder's arrivals: the longest time no message reached the queue (the
gap), the latest arrival of a fire time, fire times that never arrived (lost:
from our run table and headers; for RedBeat, the one-per-second runs it did not
send) and messages that arrived twice (a duplicate publish, which our workers'
guard refuses).
"""

from __future__ import annotations

import itertools
import signal
import time
from collections import Counter
from dataclasses import dataclass
from functools import partial
from typing import Any

from beat.store.all_roles import Store
from bench.common import (
    TASK,
    Arrival,
    Process,
    Recorder,
    Scratch,
    scratch,
    table,
    wait_for,
)
from bench.lateness import insert_schedules

SCHEDULES = 20
#: Lease TTL of ours and lock timeout of RedBeat's, in seconds: the same for both.
TTL = 10
SETTLE = 8.0


@dataclass(frozen=True, slots=True)
class Failover:
    scheduler: str
    how: str  # "SIGKILL" or "SIGTERM"
    ttl: float
    gap_s: float
    max_lateness_s: float
    expected: int
    lost: int
    duplicated: int


def measure() -> list[Failover]:
    return [*measure_ours(), *measure_redbeat()]


def measure_ours() -> list[Failover]:
    with scratch() as run:
        first = time.time() + 2
        insert_schedules(run, SCHEDULES, every=1.0, first=first)
        env = run.env(HABEAT_LOCK_TTL=str(TTL))
        beats = [start_beat(run, f"habeat-{i}", env) for i in range(3)]
        recorder = Recorder(run.redis_url, run.queue_key).start()
        store = run.store()
        try:
            wait_for(lambda: store.leader_info() is not None, timeout=30)
            results = []
            for how in (signal.SIGKILL, signal.SIGTERM):
                time.sleep(SETTLE)
                info = store.leader_info()
                if info is None:
                    raise RuntimeError("no leader: see the beat logs in " + str(run.workdir))
                leader = next(b for b in beats if f":{b.pid}:" in f":{info.holder}:")
                killed_at = time.time()
                leader.kill(how)
                wait_for(partial(newer_leader, store, info.epoch), timeout=TTL * 3)
                time.sleep(SETTLE)
                arrivals = recorder.arrivals()
                results.append(analyse_ours(how, arrivals, first, killed_at, time.time()))
            return results
        finally:
            for beat in beats:
                beat.stop()
            recorder.stop()
            store.dispose()


def start_beat(run: Scratch, name: str, env: dict[str, str]) -> Process:
    return Process.start(name, ["-A", "app", "beat", "-l", "info"], env, run.workdir)


def newer_leader(store: Store, epoch: int) -> bool:
    info = store.leader_info()
    return info is not None and info.epoch > epoch


def analyse_ours(
    how: signal.Signals, arrivals: list[Arrival], first: float, killed_at: float, until: float
) -> Failover:
    """Every fire time from 5 s before the stop to 5 s before the end must arrive once
    (the schedules fire at ``first`` + whole seconds)."""
    start, end = killed_at - 5, until - 5
    ours = [a for a in arrivals if a.task == TASK and a.fire_at and start <= a.fire_at < end]
    seen = Counter((a.schedule, round(a.fire_at - first)) for a in ours if a.fire_at)
    seconds = range(int(start - first) + 1, int(end - first))
    expected = {(f"bench-{i:07d}", k) for i in range(SCHEDULES) for k in seconds}
    return Failover(
        scheduler="habeat",
        how=how.name,
        ttl=TTL,
        gap_s=longest_gap([a.at for a in arrivals if a.task == TASK], killed_at - 1),
        max_lateness_s=max((a.at - a.fire_at for a in ours if a.fire_at), default=float("nan")),
        expected=len(expected),
        lost=len(expected - set(seen)),
        duplicated=sum(count - 1 for count in seen.values()),
    )


def longest_gap(times: list[float], after: float) -> float:
    later = sorted(t for t in times if t >= after)
    return max((b - a for a, b in itertools.pairwise(later)), default=float("nan"))


def measure_redbeat() -> list[Failover]:
    return [redbeat_once(how) for how in (signal.SIGKILL, signal.SIGTERM)]


def redbeat_once(how: signal.Signals) -> Failover:
    """Two RedBeat processes: the first takes the lock, the second waits for it."""
    with scratch() as run:
        env = run.env(
            BENCH_SCHEDULES=str(SCHEDULES),
            BENCH_EVERY="1",
            BENCH_LOCK_TIMEOUT=str(TTL),
            BENCH_MAX_INTERVAL="1",
        )
        args = ["-A", "bench.peers", "beat", "-l", "info", "-S", "redbeat.RedBeatScheduler"]
        args.append("--pidfile=")
        recorder = Recorder(run.redis_url, run.queue_key).start()
        leader = Process.start("redbeat-0", args, env, run.workdir)
        standby: Process | None = None
        try:
            wait_for(lambda: "Acquired lock" in leader.output(), timeout=30)
            standby = Process.start("redbeat-1", args, env, run.workdir)
            time.sleep(SETTLE)
            killed_at = time.time()
            leader.kill(how)
            waiting = standby
            wait_for(lambda: "Acquired lock" in waiting.output(), timeout=TTL * 3)
            time.sleep(SETTLE)
            return analyse_peer("redbeat", how, recorder.arrivals(), killed_at)
        finally:
            for beat in (leader, standby):
                if beat is not None:
                    beat.stop()
            recorder.stop()


def analyse_peer(
    scheduler: str, how: signal.Signals, arrivals: list[Arrival], killed_at: float
) -> Failover:
    """Peers carry no fire time: a 1-second schedule should arrive once a second, so
    runs missing are the seconds of the window without an arrival, per schedule."""
    start, end = killed_at - 5, arrivals[-1].at if arrivals else killed_at
    window = [a for a in arrivals if a.task == TASK and start <= a.at < end]
    expected = SCHEDULES * int(end - start)
    return Failover(
        scheduler=scheduler,
        how=how.name,
        ttl=TTL,
        gap_s=longest_gap([a.at for a in window], killed_at - 1),
        max_lateness_s=float("nan"),
        expected=expected,
        lost=max(0, expected - len(window)),
        duplicated=sum(n - 1 for n in Counter(a.task_id for a in window).values()),
    )


def report(results: list[Failover]) -> list[dict[str, Any]]:
    rows = [
        [
            r.scheduler,
            r.how,
            f"{r.ttl:g}",
            f"{r.gap_s:.2f}",
            f"{r.ttl + 1:g}",
            f"{r.max_lateness_s:.2f}",
            r.expected,
            r.lost,
            r.duplicated,
        ]
        for r in results
    ]
    headers = [
        "scheduler",
        "leader stopped by",
        "TTL s",
        "gap s",
        "target gap s",
        "max lateness s",
        "fire times",
        "lost",
        "duplicated",
    ]
    print(table(headers, rows), flush=True)
    return [{name: getattr(r, name) for name in r.__slots__} for r in results]
