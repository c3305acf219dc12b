"""Finished runs indexed by age, so retention finds the oldest without a table scan.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-03
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

# Written out: a migration keeps the states of its time.
FINISHED = "state IN ('succeeded', 'failed', 'lost', 'skipped', 'cancelled', 'expired')"


def upgrade() -> None:
    # Retention deletes the oldest finished runs batch by batch; without this index each
    # batch scans the whole run history, which grows with the retention.
    op.create_index(
        "ix_beat_runs_finished_age",
        "beat_runs",
        [sa.text("coalesce(finished_at, claimed_at)")],
        postgresql_where=sa.text(FINISHED),
    )


def downgrade() -> None:
    op.drop_index("ix_beat_runs_finished_age", "beat_runs")
