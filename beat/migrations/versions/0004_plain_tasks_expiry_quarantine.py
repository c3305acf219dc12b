"""Plain tasks, expired runs, caller task IDs and quarantined schedules.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-03
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

TZ = sa.DateTime(timezone=True)
STATES_BEFORE = (
    "'pending', 'queued', 'running', 'succeeded', 'failed', 'retrying', 'lost', 'skipped',"
    " 'cancelled'"
)
STATES_AFTER = STATES_BEFORE + ", 'expired'"


def upgrade() -> None:
    # The Celery task ID when the caller chose one that is not a UUID (the run ID is
    # then derived from it): a reclaimed run is published again under this ID.
    op.add_column("beat_runs", sa.Column("task_id", sa.Text))
    # When a worker took the run's message (plain tasks are recorded at receipt).
    op.add_column("beat_runs", sa.Column("received_at", TZ))
    # The run's task does not use the idempotent base: never published again once taken.
    op.add_column(
        "beat_runs", sa.Column("plain", sa.Boolean, nullable=False, server_default=sa.false())
    )
    op.drop_constraint("ck_beat_runs_state", "beat_runs")
    op.create_check_constraint("ck_beat_runs_state", "beat_runs", f"state IN ({STATES_AFTER})")
    # Set when the scheduler disabled a schedule it could not plan or publish;
    # disabled_reason says why. Health is red while any schedule is quarantined.
    op.add_column("beat_schedules", sa.Column("quarantined_at", TZ))


def downgrade() -> None:
    op.drop_column("beat_schedules", "quarantined_at")
    op.execute("UPDATE beat_runs SET state = 'cancelled' WHERE state = 'expired'")
    op.drop_constraint("ck_beat_runs_state", "beat_runs")
    op.create_check_constraint("ck_beat_runs_state", "beat_runs", f"state IN ({STATES_BEFORE})")
    for column in ("plain", "received_at", "task_id"):
        op.drop_column("beat_runs", column)
