"""What the audit log costs a claim, on a scratch database:

1. a claim's advance of 100,000 schedules (next and last fire time, run count: no
   change to record), with the update trigger on and off;
2. 10,000 schedules ending in one claim (one-offs that fired), recorded by the row
   trigger, as any other writer's changes are, against the claim's own set-wise record
   (``beat.store.schedule_changes.record_ends``) with the trigger told to leave them;

each against the statement with no trigger at all. Each is timed ``--repeats`` times
inside a transaction rolled back::

    .venv/bin/python -m bench.audit_cost
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

from sqlalchemy import Connection, text

from beat.store.schedule_changes import RECORDED_SETTING, record_ends
from bench.common import scratch, table

ADVANCED = 100_000
ENDED = 10_000

_ADVANCE = text(
    "UPDATE beat_schedules SET next_fire_at = next_fire_at + interval '1 hour',"
    " last_fire_at = next_fire_at, runs_count = runs_count + 1"
)
_END = text("UPDATE beat_schedules SET next_fire_at = NULL WHERE id <= :ended")
UPDATE_TRIGGER = "beat_schedules_recorded_update"
#: The row trigger records (any writer), the claim records itself (the trigger told to
#: leave it), and no trigger at all (the statement alone: the floor).
TRIGGER_RECORDS, CLAIM_RECORDS, NO_TRIGGER = "trigger records", "claim records", "no trigger"
MODES = (TRIGGER_RECORDS, CLAIM_RECORDS, NO_TRIGGER)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    options = parser.parse_args(argv)
    with scratch() as bench:
        bench.execute(
            "INSERT INTO beat_schedules (name, task, trigger_kind, every_seconds, anchor_at,"
            " next_fire_at) SELECT 's' || g, 'tasks.demo.add', 'every', 3600, now(), now()"
            " FROM generate_series(1, :count) AS g",
            {"count": ADVANCED},
        )
        store = bench.store()
        try:
            with store.engine.connect() as conn:

                def timed(work: Callable[[Connection], object], *, mode: str) -> float:
                    return _timed(conn, work, mode=mode)

                repeats = options.repeats

                advance = [
                    [timed(lambda c: c.execute(_ADVANCE), mode=mode) for _ in range(repeats)]
                    for mode in MODES
                ]
                end = [[timed(_END_BY[mode], mode=mode) for _ in range(repeats)] for mode in MODES]
                rows = [
                    _row(f"advance {ADVANCED:,} (nothing to record)", advance),
                    _row(f"{ENDED:,} one-offs end", end),
                ]
        finally:
            store.dispose()
    print(table(["statement", *(f"{mode} (ms, median)" for mode in MODES)], rows))
    return 0


def _timed(conn: Connection, work: Callable[[Connection], object], *, mode: str) -> float:
    """Seconds ``work`` takes in a transaction of a claim (rolled back), in ``mode``."""
    with conn.begin() as transaction:
        conn.execute(text("SELECT set_config('beat.claiming', 'on', true)"))
        if mode == CLAIM_RECORDS:
            conn.execute(text(f"SELECT set_config('{RECORDED_SETTING}', 'on', true)"))
        if mode == NO_TRIGGER:
            conn.execute(text(f"ALTER TABLE beat_schedules DISABLE TRIGGER {UPDATE_TRIGGER}"))
        started = time.perf_counter()
        work(conn)
        elapsed = time.perf_counter() - started
        transaction.rollback()
    return elapsed


def _end_by_trigger(conn: Connection) -> None:
    conn.execute(_END, {"ended": ENDED})


def _end_by_claim(conn: Connection) -> None:
    record_ends(conn, [(schedule_id, None) for schedule_id in range(1, ENDED + 1)])
    conn.execute(_END, {"ended": ENDED})


_END_BY = {
    TRIGGER_RECORDS: _end_by_trigger,
    CLAIM_RECORDS: _end_by_claim,
    NO_TRIGGER: _end_by_trigger,
}


def _row(label: str, timings: list[list[float]]) -> list[str]:
    return [label, *(f"{statistics.median(times) * 1000:.0f}" for times in timings)]


if __name__ == "__main__":
    raise SystemExit(main())
