"""The leader, and each worker process running a run, record the database session
they hold (crash detection).

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-03
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # NULL: the leader holds no such session (an older beat, or a pooler in
    # transaction mode); standbys then wait for its lease to expire, as before.
    op.add_column("beat_leader", sa.Column("session_pid", sa.Integer, nullable=True))
    op.add_column(
        "beat_leader", sa.Column("session_started_at", sa.DateTime(timezone=True), nullable=True)
    )
    # The name of the Redis connection it keeps too: a crash closes both, a cut link one.
    op.add_column("beat_leader", sa.Column("beacon", sa.Text, nullable=True))
    # The session of the worker process running the run: gone, the run is reclaimed
    # at once. NULL: not known (a plain task, an older worker): its lease decides.
    op.add_column("beat_runs", sa.Column("session_pid", sa.Integer, nullable=True))
    op.add_column("beat_runs", sa.Column("beacon", sa.Text, nullable=True))
    # The worker's main process keeps one too: a run whose pool process died under a
    # living worker crashed it (an attempt); one whose whole worker died was
    # interrupted (not an attempt).
    op.add_column("beat_workers", sa.Column("session_pid", sa.Integer, nullable=True))
    op.add_column("beat_workers", sa.Column("beacon", sa.Text, nullable=True))


def downgrade() -> None:
    op.drop_column("beat_workers", "beacon")
    op.drop_column("beat_workers", "session_pid")
    op.drop_column("beat_runs", "beacon")
    op.drop_column("beat_runs", "session_pid")
    op.drop_column("beat_leader", "beacon")
    op.drop_column("beat_leader", "session_started_at")
    op.drop_column("beat_leader", "session_pid")
