"""PostgreSQL's own floor for a burst: N daily crons overdue, claimed and marked
published by SQL alone, in the claim's batches (no Python between the statements,
no broker). What a leader adds on top of this is its own work per run.

    .venv/bin/python -m bench.claim_floor --schedules 100000

Each batch does what a claim writes (the same tables, indexes and constraints):
lock the due schedules (``FOR UPDATE SKIP LOCKED``), insert a pending run per
schedule, advance each schedule a day, commit; then mark the batch's runs queued,
commit. Prints runs/s; nothing is asserted.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import psycopg
from sqlalchemy.engine import make_url

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from beat.config import BeatConfig
from bench.common import scratch
from bench.lateness import insert_schedules

#: One claim of ``batch`` due schedules and the mark of its runs, batch after batch,
#: each committed: PL/pgSQL, so that no round trip or client work is counted.
CLAIM_IN_SQL = """
CREATE PROCEDURE bench_claim_floor(batch int) LANGUAGE plpgsql AS $$
DECLARE claimed int;
BEGIN
  LOOP
    WITH due AS (
      SELECT id, next_fire_at FROM beat_schedules
      WHERE enabled AND next_fire_at <= now()
      ORDER BY next_fire_at LIMIT batch FOR UPDATE SKIP LOCKED
    ), inserted AS (
      INSERT INTO beat_runs (id, schedule_id, schedule_name, task, args, kwargs, options,
                             max_attempts, fire_at, state, epoch, attempt)
      SELECT gen_random_uuid(), s.id, s.name, s.task, s.args, s.kwargs, s.options,
             s.max_attempts, due.next_fire_at, 'pending', 1, 0
      FROM due JOIN beat_schedules s ON s.id = due.id
      ON CONFLICT ON CONSTRAINT uq_beat_runs_schedule_fire_at DO NOTHING
      RETURNING id
    ), advanced AS (
      UPDATE beat_schedules s
      SET next_fire_at = due.next_fire_at + interval '1 day',
          last_fire_at = due.next_fire_at, runs_count = s.runs_count + 1
      FROM due WHERE s.id = due.id
    )
    SELECT count(*) INTO claimed FROM inserted;
    COMMIT;
    EXIT WHEN claimed = 0;
    UPDATE beat_runs SET state = 'queued', published_at = now() WHERE state = 'pending';
    COMMIT;
  END LOOP;
END $$
"""


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.claim_floor")
    parser.add_argument("--schedules", type=int, default=100_000)
    parser.add_argument(
        "--batch",
        type=int,
        default=BeatConfig().claim_batch,
        help="the claim batch (default: beat's)",
    )
    options = parser.parse_args()
    with scratch() as run:
        insert_schedules(run, options.schedules, cron="0 0 * * *", first=time.time() - 1)
        url = make_url(run.database_url).set(drivername="postgresql")
        with psycopg.connect(url.render_as_string(hide_password=False), autocommit=True) as conn:
            conn.execute("VACUUM ANALYZE")
            conn.execute(CLAIM_IN_SQL)
            started = time.perf_counter()
            conn.execute("CALL bench_claim_floor(%s)", [options.batch])
            elapsed = time.perf_counter() - started
            row = conn.execute("SELECT count(*) FROM beat_runs WHERE state = 'queued'").fetchone()
    queued = row[0] if row else 0
    print(
        f"{queued:,} runs claimed and marked published by PostgreSQL alone in {elapsed:.2f} s:"
        f" {queued / elapsed:,.0f} runs/s ({elapsed / queued * 1e6:.0f} µs a run)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
