"""The halves of every process's crash-detection beacon, one row per beacon, so that
the runs, the worker's presence and the leader row that name a beacon follow its
newest database session, and each half says which server it was opened on.

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-04
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # The session_pid columns of beat_runs, beat_workers and beat_leader stay, empty:
    # processes of the release before may still write and read them during a deploy.
    op.create_table(
        "beat_beacons",
        sa.Column("name", sa.Text, primary_key=True),
        sa.Column("session_pid", sa.Integer, nullable=False),
        sa.Column("session_started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("postgres_server", sa.Text, nullable=False),
        sa.Column("redis_server", sa.Text, nullable=False),
        sa.Column(
            "recorded_at",
            sa.DateTime(timezone=True),
            nullable=False,
            server_default=sa.text("now()"),
        ),
    )


def downgrade() -> None:
    op.drop_table("beat_beacons")
