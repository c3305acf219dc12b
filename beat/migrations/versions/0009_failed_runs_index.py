"""Failed and lost runs indexed by schedule, so the schedule list can show the failing
schedules without reading the newest run of every schedule.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-04
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None

# Written out: a migration keeps the states of its time.
FAILED = "state IN ('failed', 'lost')"


def upgrade() -> None:
    # Partial: a claim inserts pending runs, which add no entry; only a run that ends
    # failed or lost does (about as rare as failures are).
    op.create_index(
        "ix_beat_runs_failed_by_schedule",
        "beat_runs",
        ["schedule_name"],
        postgresql_where=sa.text(FAILED),
    )


def downgrade() -> None:
    op.drop_index("ix_beat_runs_failed_by_schedule", "beat_runs")
