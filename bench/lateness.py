"""Lateness and throughput: N every-minute schedules, one scheduler process, all
of them due at the same minute boundary.

For each scheduler (ours, Celery's PersistentScheduler, celery-redbeat) in turn:
start it, let it settle, and at the first minute boundary after that take every
message off the queue with the recorder. Lateness is arrival minus the boundary;
"all queued" is when the N-th message arrived; CPU is the scheduler process's
user+system time over the minute around the boundary; RSS is its peak.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from bench.common import (
    TASK,
    Process,
    Recorder,
    Scratch,
    next_minute,
    percentile,
    scratch,
    sleep_until,
    utc,
    wait_for,
)

SCHEDULERS = ("habeat", "celery", "redbeat")
#: Ours with claiming ahead off: every run claimed, built and sent after its fire time,
#: so the burst's "all queued" is the sustained claim + publish rate.
NO_AHEAD = "habeat-no-ahead"
#: Throughput compares these by default.
BURST_SCHEDULERS = ("habeat", NO_AHEAD, "celery", "redbeat")


@dataclass(frozen=True, slots=True)
class Lateness:
    scheduler: str
    schedules: int
    arrived: int
    p50_ms: float
    p99_ms: float
    max_ms: float
    #: Seconds from the boundary until the last of the N messages was queued.
    all_queued_s: float
    cpu_s_per_min: float
    peak_rss_mib: float

    @property
    def runs_per_s(self) -> float:
        return self.arrived / self.all_queued_s if self.all_queued_s > 0 else float("nan")


def measure(scheduler: str, count: int, *, once: bool = False) -> Lateness:
    """``count`` every-minute schedules; with ``once``, daily crons all due at the
    same minute (a single burst, for throughput: no second minute piles up behind)."""
    with scratch() as run:
        # Time to start (and load or sync the schedules) before the boundary we time.
        boundary = next_minute(time.time() + 15 + count / 2000)
        cron = f"{utc(boundary):%M %H} * * *" if once else "* * * * *"
        process = start(scheduler, count, run, boundary, cron)
        recorder = Recorder(run.redis_url, run.queue_key).start()
        try:
            return observe(scheduler, count, boundary, process, recorder)
        finally:
            process.stop()
            recorder.stop()


def start(scheduler: str, count: int, run: Scratch, boundary: float, cron: str) -> Process:
    """Start ``scheduler`` with ``count`` schedules of ``cron`` (ours first due at
    ``boundary``; the peers compute it themselves)."""
    if scheduler in ("habeat", NO_AHEAD):
        insert_schedules(run, count, cron=cron, first=boundary)
        off = {"HABEAT_CLAIM_AHEAD": "0", "HABEAT_CLAIM_AHEAD_MAX": "0"}
        env = run.env(**off) if scheduler == NO_AHEAD else run.env()
        return Process.start(scheduler, ["-A", "app", "beat", "-l", "info"], env, run.workdir)
    chosen = {"celery": "celery.beat:PersistentScheduler", "redbeat": "redbeat.RedBeatScheduler"}
    args = ["-A", "bench.peers", "beat", "-l", "info", "-S", chosen[scheduler]]
    args += ["-s", str(run.workdir / "celerybeat-schedule"), "--pidfile="]
    env = run.env(BENCH_SCHEDULES=str(count), BENCH_CRON=cron)
    return Process.start(scheduler, args, env, run.workdir)


def insert_schedules(
    run: Scratch,
    count: int,
    *,
    first: float,
    cron: str | None = None,
    every: float | None = None,
    task: str = TASK,
) -> None:
    """``count`` schedules of the benchmark task (a cron or an interval), first due at
    ``first`` (wall clock), inserted in one statement."""
    trigger = (
        "'cron', :cron, NULL, NULL, :first" if cron else "'every', NULL, :every, :first, :first"
    )
    run.execute(
        "INSERT INTO beat_schedules (name, task, trigger_kind, cron, every_seconds,"
        " anchor_at, next_fire_at, args)"
        f" SELECT 'bench-' || lpad(i::text, 7, '0'), :task, {trigger},"
        " jsonb_build_array(i) FROM generate_series(0, :count - 1) AS i",
        {"task": task, "cron": cron, "every": every, "count": count, "first": utc(first)},
    )


def observe(
    scheduler: str, count: int, boundary: float, process: Process, recorder: Recorder
) -> Lateness:
    sleep_until(boundary - 30)
    cpu_before, cpu_from = process.cpu_seconds(), time.time()
    sleep_until(boundary - 0.5)
    before = recorder.count()
    # Bounded: a scheduler that has not queued them all by then is reported as such.
    wait_for(lambda: recorder.count() - before >= count, timeout=min(60 + count / 500, 240))
    sleep_until(boundary + 30)
    cpu_per_min = (process.cpu_seconds() - cpu_before) / ((time.time() - cpu_from) / 60)
    rss = process.peak_rss_mib()
    everything = recorder.arrivals()
    arrivals = [a for a in everything[before:] if a.task == TASK][:count]
    lateness = sorted(max(0.0, a.at - boundary) for a in arrivals)
    # Ours only (the peers send no fire time): taken from the queue before the fire
    # time its headers give, at any point of the run. Must be 0.
    early = sum(1 for a in everything if a.fire_at is not None and a.at < a.fire_at)
    print(
        f"  {scheduler:8} {count:>7,} schedules, boundary {utc(boundary):%H:%M:%S}:"
        f" {len(arrivals):,} arrived, {early} before their fire time; the recorder's"
        f" slowest pop of a batch {recorder.slowest_pop * 1000:.0f} ms",
        flush=True,
    )
    return Lateness(
        scheduler=scheduler,
        schedules=count,
        arrived=len(arrivals),
        p50_ms=percentile(lateness, 50) * 1000,
        p99_ms=percentile(lateness, 99) * 1000,
        max_ms=(lateness[-1] if lateness else float("nan")) * 1000,
        all_queued_s=lateness[-1] if lateness else float("nan"),
        cpu_s_per_min=cpu_per_min,
        peak_rss_mib=rss,
    )
