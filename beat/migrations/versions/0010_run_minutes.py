"""Finished runs summarised by minute and state, so the run statistics of long windows
read a row a minute instead of every run.

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-05
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None

# Written out: a migration keeps the states of its time.
STATES = (
    "state IN ('pending', 'queued', 'running', 'succeeded', 'failed', 'retrying', 'lost',"
    " 'skipped', 'cancelled', 'expired')"
)


def upgrade() -> None:
    op.create_table(
        "beat_run_minutes",
        sa.Column("minute", sa.DateTime(timezone=True), primary_key=True),
        sa.Column("state", sa.Text(), primary_key=True),
        sa.Column("runs", sa.BigInteger(), nullable=False),
        sa.Column("published", sa.BigInteger(), nullable=False),
        sa.Column("lateness_bins", postgresql.ARRAY(sa.Integer())),
        sa.Column("lateness_max", sa.Double()),
        sa.Column("lateness_sum", sa.Double()),
        sa.CheckConstraint(STATES, name="ck_beat_run_minutes_state"),
    )
    op.create_table(
        "beat_run_summary",
        sa.Column("id", sa.Boolean(), primary_key=True, server_default=sa.text("true")),
        sa.Column("summarised_until", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint("id", name="ck_beat_run_summary_one_row"),
    )


def downgrade() -> None:
    op.drop_table("beat_run_summary")
    op.drop_table("beat_run_minutes")
