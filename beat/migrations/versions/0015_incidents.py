"""The failing monitor: each schedule's thresholds (NULL: the cluster's default), the
incidents the leader opens and resolves, how far it has looked, the channels it
notifies and the outbox of its notifications.

Adding two columns without a default rewrites nothing: the schedule table is locked for
a moment only.

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-06
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None

TZ = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.add_column("beat_schedules", sa.Column("alert_after_failures", sa.Integer))
    op.add_column("beat_schedules", sa.Column("pause_after_failures", sa.Integer))
    op.create_check_constraint(
        "ck_beat_schedules_failure_thresholds",
        "beat_schedules",
        "alert_after_failures >= 0 AND pause_after_failures >= 0",
    )
    op.create_table(
        "beat_incidents",
        sa.Column("id", sa.BigInteger, sa.Identity(always=True), primary_key=True),
        sa.Column(
            "schedule_id",
            sa.BigInteger,
            sa.ForeignKey("beat_schedules.id", ondelete="SET NULL"),
        ),
        sa.Column("schedule_name", sa.Text, nullable=False),
        sa.Column("kind", sa.Text, nullable=False),
        sa.Column("opened_at", TZ, nullable=False, server_default=sa.text("now()")),
        sa.Column("epoch", sa.BigInteger, nullable=False),
        sa.Column("failures", sa.Integer, nullable=False),
        sa.Column("first_failure_at", TZ),
        sa.Column("last_error", sa.Text),
        sa.Column("paused_at", TZ),
        sa.Column("paused_after_fire_at", TZ),
        sa.Column("resolved_at", TZ),
        sa.Column("resolution", sa.Text),
        sa.CheckConstraint("kind IN ('failing', 'stall')", name="ck_beat_incidents_kind"),
    )
    op.create_index(
        "uq_beat_incidents_open",
        "beat_incidents",
        ["schedule_id", "kind"],
        unique=True,
        postgresql_where=sa.text("resolved_at IS NULL"),
    )
    op.create_index(
        "uq_beat_incidents_cluster_open",
        "beat_incidents",
        ["kind"],
        unique=True,
        postgresql_where=sa.text("kind = 'stall' AND resolved_at IS NULL"),
    )
    op.create_index("ix_beat_incidents_opened_at", "beat_incidents", [sa.text("opened_at DESC")])
    op.create_table(
        "beat_monitor_progress",
        sa.Column("id", sa.Boolean, primary_key=True, server_default=sa.text("true")),
        sa.Column("checked_until", TZ, nullable=False),
        sa.CheckConstraint("id", name="ck_beat_monitor_progress_one_row"),
    )

    op.create_table(
        "beat_channels",
        sa.Column("name", sa.Text, primary_key=True),
        sa.Column("kind", sa.Text, nullable=False),
        sa.Column("target", sa.Text, nullable=False),
        sa.Column("created_at", TZ, nullable=False, server_default=sa.text("now()")),
        sa.CheckConstraint("kind IN ('webhook', 'slack', 'email')", name="ck_beat_channels_kind"),
    )
    op.create_table(
        "beat_notifications",
        sa.Column("id", sa.BigInteger, sa.Identity(always=True), primary_key=True),
        sa.Column(
            "channel",
            sa.Text,
            sa.ForeignKey("beat_channels.name", ondelete="CASCADE"),
            nullable=False,
        ),
        sa.Column(
            "incident_id", sa.BigInteger, sa.ForeignKey("beat_incidents.id", ondelete="CASCADE")
        ),
        sa.Column("event", sa.Text, nullable=False),
        sa.Column("payload", JSONB, nullable=False),
        sa.Column("created_at", TZ, nullable=False, server_default=sa.text("now()")),
        sa.Column("next_attempt_at", TZ, nullable=False, server_default=sa.text("now()")),
        sa.Column("attempts", sa.Integer, nullable=False, server_default=sa.text("0")),
        sa.Column("taken_by_epoch", sa.BigInteger),
        sa.Column("last_error", sa.Text),
        sa.Column("sent_at", TZ),
        sa.Column("given_up_at", TZ),
        sa.CheckConstraint(
            "event IN ('opened', 'paused', 'resolved')", name="ck_beat_notifications_event"
        ),
    )
    op.create_index(
        "ix_beat_notifications_due",
        "beat_notifications",
        ["next_attempt_at"],
        postgresql_where=sa.text("sent_at IS NULL AND given_up_at IS NULL"),
    )


def downgrade() -> None:
    op.drop_table("beat_notifications")
    op.drop_table("beat_channels")
    op.drop_table("beat_monitor_progress")
    op.drop_table("beat_incidents")
    op.drop_constraint("ck_beat_schedules_failure_thresholds", "beat_schedules")
    op.drop_column("beat_schedules", "pause_after_failures")
    op.drop_column("beat_schedules", "alert_after_failures")
