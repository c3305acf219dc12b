"""Heartbeats: what keeping many long runs alive costs, the held pass of
``python -m bench workers``.

``RUNS`` tasks that each sleep a minute are sent by beat and all taken at once
by one worker process (a threads pool of as many threads); once every one has
started, the statements the worker sends and the transactions the database commits
are counted over ``WINDOW`` seconds: what the leases of the running runs cost per
second, with nothing else going on. Plain runs hold a receipt lease renewed by the
worker's heartbeat; runs on the idempotent base a run lease renewed by ``RunLeases``:
each is one statement a process an interval, so the figure does not grow with the
runs held.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from bench.common import Scratch, scratch, table, wait_for
from bench.worker_plain import HELD, HELD_SECONDS
from bench.worker_tracked import GUARDED_HELD
from bench.workers import Probe, Server, fill, reset, start_worker

RUNS = 1000
#: Seconds over which the statements are counted, all the runs held (each sleeps
#: ``bench.worker_plain.HELD_SECONDS``: longer than their start and the window).
WINDOW = 30.0


#: The modes that hold leases, and their held task.
_TASK = {"plain": HELD, "guarded": GUARDED_HELD}


@dataclass(frozen=True, slots=True)
class Held:
    mode: str
    runs: int
    window_s: float
    statements_per_s: float
    transactions_per_s: float


def measure_held(run: Scratch, mode: str, task: str, runs: int) -> Held:
    """``runs`` long runs of ``task`` (sent as ``mode`` sends them) running at once on
    one worker process: its statements and the database's transactions per second."""
    reset(run)
    fill(run, mode, task, runs)
    probe = f"{run.prefix}:probe:held-{mode}"
    worker = start_worker(run, mode, "threads", runs, probe)
    try:
        started = wait_for(
            lambda: Probe.read(run, probe).started >= runs, timeout=HELD_SECONDS - WINDOW
        )
        if not started:
            raise RuntimeError(f"{mode}: {Probe.read(run, probe).started} of {runs} started")
        before, statements = Server.read(run), Probe.read(run, probe).statements
        began = time.monotonic()
        time.sleep(WINDOW)
        statements = Probe.read(run, probe).statements - statements
        window = time.monotonic() - began
        after = Server.read(run)
        ended = Probe.read(run, probe).ended
    finally:
        worker.kill()
    if ended:
        raise RuntimeError(f"{mode}: {ended} held runs ended within the window")
    return Held(
        mode=mode,
        runs=runs,
        window_s=window,
        statements_per_s=statements / window,
        transactions_per_s=(after.transactions - before.transactions) / window,
    )


def measure(modes: Sequence[str], runs: int = RUNS) -> list[Held]:
    found = []
    with scratch() as run:
        for mode in modes:
            if mode in _TASK:
                found.append(measure_held(run, mode, _TASK[mode], runs))
                print(
                    f"  held {mode:8}: {found[-1].statements_per_s:.2f} statements/s,"
                    f" {found[-1].transactions_per_s:.2f} PG transactions/s",
                    flush=True,
                )
    return found


def report(held: list[Held]) -> list[dict[str, Any]]:
    if held:
        print(f"\n{held[0].runs:,} runs of a minute held at once, one threads worker process\n")
        print(
            table(
                ["mode", "runs held", "window s", "statements/s", "PG transactions/s"],
                [_row(h) for h in held],
            )
        )
    return [asdict(h) for h in held]


def _row(held: Held) -> list[Any]:
    return [
        held.mode,
        held.runs,
        f"{held.window_s:.0f}",
        f"{held.statements_per_s:.2f}",
        f"{held.transactions_per_s:.2f}",
    ]
