"""Where an imported schedule came from: the scheduler it was read from
(django-celery-beat, RedBeat, celery beat) and its identity there, so that importing
again recognises it; and the description it had there.

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-06
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Both NULL for a schedule made here: only `schedules import` writes them.
    op.add_column("beat_schedules", sa.Column("source", sa.Text))
    op.add_column("beat_schedules", sa.Column("source_id", sa.Text))
    op.add_column("beat_schedules", sa.Column("description", sa.Text))


def downgrade() -> None:
    op.drop_column("beat_schedules", "description")
    op.drop_column("beat_schedules", "source_id")
    op.drop_column("beat_schedules", "source")
