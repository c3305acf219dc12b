"""Worker-side run bookkeeping: retries, duplicate deliveries, duration.

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Celery retries of the run so far: a delivery from before a retry is a stale duplicate.
    op.add_column(
        "beat_runs", sa.Column("retries", sa.Integer, nullable=False, server_default=sa.text("0"))
    )
    # Deliveries refused by the idempotency guard (duplicates are normal; they are counted, not hidden).
    op.add_column(
        "beat_runs",
        sa.Column("duplicate_deliveries", sa.Integer, nullable=False, server_default=sa.text("0")),
    )
    op.add_column("beat_runs", sa.Column("duration_seconds", sa.Double))
    op.alter_column("beat_runs", "attempt", server_default=sa.text("0"))
    # Runs stuck in the broker: queued for long.
    op.create_index(
        "ix_beat_runs_queued_published_at",
        "beat_runs",
        ["published_at"],
        postgresql_where=sa.text("state = 'queued'"),
    )


def downgrade() -> None:
    op.drop_index("ix_beat_runs_queued_published_at", "beat_runs")
    op.alter_column("beat_runs", "attempt", server_default=sa.text("0"))
    op.drop_column("beat_runs", "duration_seconds")
    op.drop_column("beat_runs", "duplicate_deliveries")
    op.drop_column("beat_runs", "retries")
