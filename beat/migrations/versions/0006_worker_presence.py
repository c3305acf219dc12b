"""Workers' presence, so the reaper tells a run that crashed its worker from a worker
killed; when a retry is due.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-03
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

TZ = sa.DateTime(timezone=True)


def upgrade() -> None:
    # One row per worker (its Celery node name), renewed by the worker's main process.
    op.create_table(
        "beat_workers",
        sa.Column("name", sa.Text, primary_key=True),
        sa.Column("pid", sa.Integer, nullable=False),
        sa.Column("booted_at", TZ, nullable=False),
        sa.Column("seen_at", TZ, nullable=False),
    )
    # Attempts ended by their worker's death (killed, restarted): not the run's fault,
    # so they do not use up its max_attempts.
    op.add_column(
        "beat_runs",
        sa.Column("interruptions", sa.Integer, nullable=False, server_default=sa.text("0")),
    )
    # When the retry a worker asked for is due: past it, the leader looks for its message.
    op.add_column("beat_runs", sa.Column("retry_due_at", TZ))
    op.create_index(
        "ix_beat_runs_retrying_due",
        "beat_runs",
        ["retry_due_at"],
        postgresql_where=sa.text("state = 'retrying'"),
    )


def downgrade() -> None:
    op.drop_index("ix_beat_runs_retrying_due", "beat_runs")
    op.drop_column("beat_runs", "retry_due_at")
    op.drop_column("beat_runs", "interruptions")
    op.drop_table("beat_workers")
