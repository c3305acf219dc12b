"""A cron schedule may need both day fields to match (Celery's crontab).

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-03
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # When both day fields are restricted, a day must match both (a beat_schedule
    # crontab(), whose fields Celery ANDs) rather than either (cron's own rule).
    # Existing rows keep cron's rule, which is what they were read with so far.
    op.add_column(
        "beat_schedules",
        sa.Column("cron_both_days", sa.Boolean, nullable=False, server_default=sa.false()),
    )


def downgrade() -> None:
    # Schedules that needed it are read with cron's rule again, as the code before
    # this revision read every crontab().
    op.drop_column("beat_schedules", "cron_both_days")
