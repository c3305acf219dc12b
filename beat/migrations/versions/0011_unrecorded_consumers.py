"""Consumers of beat's queues that do not record runs, as the leader found them, and how
often lost-message recovery sent each run again.

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-05
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None

TZ = sa.DateTime(timezone=True)


def upgrade() -> None:
    # One row per queue and consumer found consuming it without recording runs.
    op.create_table(
        "beat_unrecorded_consumers",
        sa.Column("queue", sa.Text, primary_key=True),
        sa.Column("consumer", sa.Text, primary_key=True),
        sa.Column("first_seen_at", TZ, nullable=False, server_default=sa.text("now()")),
        sa.Column("seen_at", TZ, nullable=False, server_default=sa.text("now()")),
        sa.Column("gone_at", TZ),
    )
    # Copies of a run that lost-message recovery sent: bounded.
    op.add_column(
        "beat_runs",
        sa.Column("recovery_sends", sa.Integer, nullable=False, server_default=sa.text("0")),
    )


def downgrade() -> None:
    op.drop_column("beat_runs", "recovery_sends")
    op.drop_table("beat_unrecorded_consumers")
