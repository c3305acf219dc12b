"""Overlap policy, jitter and start/end/max-runs windows of schedules.

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

TZ = sa.DateTime(timezone=True)
ACTIVE = "state IN ('pending', 'queued', 'running', 'retrying')"


def upgrade() -> None:
    op.add_column(
        "beat_schedules",
        sa.Column("overlap_policy", sa.Text, nullable=False, server_default="allow"),
    )
    op.add_column(
        "beat_schedules", sa.Column("jitter_seconds", sa.Double, nullable=False, server_default="0")
    )
    op.add_column("beat_schedules", sa.Column("start_at", TZ))
    op.add_column("beat_schedules", sa.Column("end_at", TZ))
    op.add_column("beat_schedules", sa.Column("max_runs", sa.Integer))
    op.add_column(
        "beat_schedules", sa.Column("runs_count", sa.Integer, nullable=False, server_default="0")
    )
    op.add_column("beat_schedules", sa.Column("disabled_reason", sa.Text))
    op.create_check_constraint(
        "ck_beat_schedules_overlap_policy",
        "beat_schedules",
        "overlap_policy IN ('allow', 'skip', 'queue_one', 'cancel_previous')",
    )
    op.create_check_constraint("ck_beat_schedules_jitter", "beat_schedules", "jitter_seconds >= 0")
    op.create_check_constraint(
        "ck_beat_schedules_max_runs", "beat_schedules", "max_runs IS NULL OR max_runs >= 1"
    )
    # A jittered run is published no earlier than this.
    op.add_column("beat_runs", sa.Column("not_before", TZ))
    # The overlap policies look up a schedule's active runs in every claim.
    op.create_index(
        "ix_beat_runs_active_by_schedule",
        "beat_runs",
        ["schedule_id"],
        postgresql_where=sa.text(ACTIVE),
    )


def downgrade() -> None:
    op.drop_index("ix_beat_runs_active_by_schedule", "beat_runs")
    op.drop_column("beat_runs", "not_before")
    for constraint in (
        "ck_beat_schedules_max_runs",
        "ck_beat_schedules_jitter",
        "ck_beat_schedules_overlap_policy",
    ):
        op.drop_constraint(constraint, "beat_schedules")
    for column in (
        "disabled_reason",
        "runs_count",
        "max_runs",
        "end_at",
        "start_at",
        "jitter_seconds",
        "overlap_policy",
    ):
        op.drop_column("beat_schedules", column)
