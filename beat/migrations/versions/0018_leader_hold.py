"""The leader row's hold: ``beat_leader.held_until``, until when the leader of
``held_epoch`` holds the row by PostgreSQL's clock, and ``held_on_database``, whether
it leads on the row alone. A leader renews it with its Redis lease; while the lease's
Redis is unreachable, a process may take a row whose hold has ended, with the next
epoch (``beat.lease.database_hold``). A hold whose ``held_epoch`` is not the row's
epoch (left by a leader of an earlier release, which does not write it) or NULL (a row
written before this revision, or by a cluster that turned the fallback off) is never
taken that way.

Nullable columns without a default rewrite nothing.

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
    op.add_column("beat_leader", sa.Column("held_epoch", sa.BigInteger))
    op.add_column("beat_leader", sa.Column("held_on_database", sa.Boolean))


def downgrade() -> None:
    op.drop_column("beat_leader", "held_on_database")
    op.drop_column("beat_leader", "held_epoch")
    op.drop_column("beat_leader", "held_until")
