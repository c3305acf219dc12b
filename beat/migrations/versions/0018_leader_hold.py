"""The leader row's hold: ``beat_leader.held_until``, until when the leader of its epoch
holds the row by PostgreSQL's clock. A leader renews it with its Redis lease; while the
lease's Redis is unreachable, a process may take a row whose hold has ended, with the
next epoch (``beat.lease.database_hold``). NULL (a row written before this revision,
or by a cluster that turned the fallback off) is never taken that way.

A nullable column without a default rewrites nothing.

Revision ID: 0018
Revises: 0017
Create Date: 2026-12-07
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("beat_leader", sa.Column("held_until", sa.DateTime(timezone=True)))


def downgrade() -> None:
    op.drop_column("beat_leader", "held_until")
