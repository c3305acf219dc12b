"""The reads of the schedules UI at scale: the run history index carries each run's
state and the time it was sent, so that the reads of a schedule's history that need
only those (its newest run's state, the statistics of one schedule) read the index
alone; and each schedule's newest outcome is kept (``beat_schedule_outcomes``), so
that the "failing" filter looks up the newest run of a few schedules, not of every
schedule that ever failed.

Building the new index and recording the outcomes of the runs summarised so far read
the whole run table, and writes to it wait meanwhile (31 s at 10,000,000 runs on a
2-core machine; reads wait only for the moment the old index is dropped): run
`schedules migrate` before the beats and workers of the new release start, as every
upgrade does.

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-06
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None

INDEX = "ix_beat_runs_schedule_name_fire_at"
# Written out: a migration keeps the states of its time.
STATES = (
    "state IN ('pending', 'queued', 'running', 'succeeded', 'failed', 'retrying', 'lost',"
    " 'skipped', 'cancelled', 'expired')"
)
FAILED = "state IN ('failed', 'lost')"
FINISHED = "state IN ('succeeded', 'failed', 'lost', 'skipped', 'cancelled', 'expired')"


def upgrade() -> None:
    # The summary first: a summariser of the release before locks it, then reads the
    # runs; locking in the other order (the run table first) could deadlock with one.
    op.execute("SELECT 1 FROM beat_run_summary FOR UPDATE")
    op.add_column("beat_run_summary", sa.Column("outcomes_until", sa.DateTime(timezone=True)))
    op.create_table(
        "beat_schedule_outcomes",
        sa.Column("schedule_name", sa.Text(), primary_key=True),
        sa.Column("fire_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("state", sa.Text(), nullable=False),
        sa.CheckConstraint(STATES, name="ck_beat_schedule_outcomes_state"),
    )
    op.create_index(
        "ix_beat_schedule_outcomes_failed",
        "beat_schedule_outcomes",
        ["schedule_name"],
        postgresql_where=sa.text(FAILED),
    )
    # The outcomes of the runs summarised so far: the next summariser goes on from
    # there. Without a summary yet, the first one records them all.
    op.execute(
        "INSERT INTO beat_schedule_outcomes (schedule_name, fire_at, state)"
        " SELECT DISTINCT ON (schedule_name) schedule_name, fire_at, state FROM beat_runs"
        f" WHERE {FINISHED} AND schedule_name IS NOT NULL AND fire_at IS NOT NULL"
        " AND coalesce(finished_at, claimed_at)"
        " < (SELECT summarised_until FROM beat_run_summary)"
        " ORDER BY schedule_name, fire_at DESC"
    )
    op.execute("UPDATE beat_run_summary SET outcomes_until = summarised_until")
    # The new index built beside the old one (writes wait, reads go on), which is then
    # dropped: reads of the run table wait only for that, a moment before the commit.
    op.create_index(
        f"{INDEX}_new",
        "beat_runs",
        ["schedule_name", sa.text("fire_at DESC")],
        postgresql_include=["state", "published_at"],
    )
    op.drop_index(INDEX, "beat_runs")
    op.execute(f"ALTER INDEX {INDEX}_new RENAME TO {INDEX}")


def downgrade() -> None:
    op.drop_table("beat_schedule_outcomes")
    op.drop_column("beat_run_summary", "outcomes_until")
    op.drop_index(INDEX, "beat_runs")
    op.create_index(INDEX, "beat_runs", ["schedule_name", sa.text("fire_at DESC")])
