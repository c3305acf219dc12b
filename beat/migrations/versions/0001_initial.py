"""Schedules, runs and the leader row; NOTIFY on schedule changes.

Revision ID: 0001
Revises:
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

TZ = sa.DateTime(timezone=True)
RUN_STATES = "'pending', 'queued', 'running', 'succeeded', 'failed', 'retrying', 'lost', 'skipped', 'cancelled'"


def upgrade() -> None:
    op.create_table(
        "beat_schedules",
        sa.Column("id", sa.BigInteger, sa.Identity(always=True), primary_key=True),
        sa.Column("name", sa.Text, nullable=False, unique=True),
        sa.Column("task", sa.Text, nullable=False),
        sa.Column("trigger_kind", sa.Text, nullable=False),
        sa.Column("cron", sa.Text),
        sa.Column("every_seconds", sa.Double),
        sa.Column("anchor_at", TZ),
        sa.Column("run_at", TZ),
        sa.Column("timezone", sa.Text, nullable=False, server_default="UTC"),
        sa.Column("args", postgresql.JSONB, nullable=False, server_default=sa.text("'[]'::jsonb")),
        sa.Column(
            "kwargs", postgresql.JSONB, nullable=False, server_default=sa.text("'{}'::jsonb")
        ),
        sa.Column(
            "options", postgresql.JSONB, nullable=False, server_default=sa.text("'{}'::jsonb")
        ),
        sa.Column("enabled", sa.Boolean, nullable=False, server_default=sa.text("true")),
        sa.Column("origin", sa.Text, nullable=False, server_default="api"),
        sa.Column("code_hash", sa.Text),
        sa.Column("misfire_policy", sa.Text, nullable=False, server_default="fire_once"),
        sa.Column("max_attempts", sa.Integer, nullable=False, server_default=sa.text("3")),
        sa.Column("next_fire_at", TZ),
        sa.Column("last_fire_at", TZ),
        sa.Column("created_at", TZ, nullable=False, server_default=sa.text("now()")),
        sa.Column("updated_at", TZ, nullable=False, server_default=sa.text("now()")),
        sa.CheckConstraint(
            "trigger_kind IN ('cron', 'every', 'once')", name="ck_beat_schedules_trigger_kind"
        ),
        sa.CheckConstraint("origin IN ('code', 'api')", name="ck_beat_schedules_origin"),
        sa.CheckConstraint(
            "misfire_policy IN ('fire_once', 'fire_all', 'skip')",
            name="ck_beat_schedules_misfire_policy",
        ),
        sa.CheckConstraint(
            "(trigger_kind = 'cron' AND cron IS NOT NULL)"
            " OR (trigger_kind = 'every' AND every_seconds > 0 AND anchor_at IS NOT NULL)"
            " OR (trigger_kind = 'once' AND run_at IS NOT NULL)",
            name="ck_beat_schedules_trigger_fields",
        ),
        sa.CheckConstraint("max_attempts >= 1", name="ck_beat_schedules_max_attempts"),
    )
    op.create_index(
        "ix_beat_schedules_due",
        "beat_schedules",
        ["next_fire_at"],
        postgresql_where=sa.text("enabled AND next_fire_at IS NOT NULL"),
    )

    op.create_table(
        "beat_runs",
        sa.Column("id", postgresql.UUID(as_uuid=True), primary_key=True),
        sa.Column(
            "schedule_id", sa.BigInteger, sa.ForeignKey("beat_schedules.id", ondelete="SET NULL")
        ),
        sa.Column("schedule_name", sa.Text),
        sa.Column("task", sa.Text, nullable=False),
        sa.Column("args", postgresql.JSONB, nullable=False, server_default=sa.text("'[]'::jsonb")),
        sa.Column(
            "kwargs", postgresql.JSONB, nullable=False, server_default=sa.text("'{}'::jsonb")
        ),
        sa.Column(
            "options", postgresql.JSONB, nullable=False, server_default=sa.text("'{}'::jsonb")
        ),
        sa.Column("fire_at", TZ),
        sa.Column("state", sa.Text, nullable=False),
        sa.Column("reason", sa.Text),
        sa.Column("epoch", sa.BigInteger),
        sa.Column("attempt", sa.Integer, nullable=False, server_default=sa.text("0")),
        sa.Column("max_attempts", sa.Integer, nullable=False, server_default=sa.text("3")),
        sa.Column("claimed_at", TZ, nullable=False, server_default=sa.text("now()")),
        sa.Column("published_at", TZ),
        sa.Column("started_at", TZ),
        sa.Column("finished_at", TZ),
        sa.Column("lease_owner", sa.Text),
        sa.Column("lease_expires_at", TZ),
        sa.Column("worker", sa.Text),
        sa.Column("error", sa.Text),
        sa.UniqueConstraint("schedule_id", "fire_at", name="uq_beat_runs_schedule_fire_at"),
        sa.CheckConstraint(f"state IN ({RUN_STATES})", name="ck_beat_runs_state"),
    )
    op.create_index(
        "ix_beat_runs_pending",
        "beat_runs",
        ["claimed_at"],
        postgresql_where=sa.text("state = 'pending'"),
    )
    op.create_index(
        "ix_beat_runs_schedule_name_fire_at",
        "beat_runs",
        ["schedule_name", sa.text("fire_at DESC")],
    )
    op.create_index(
        "ix_beat_runs_running_lease",
        "beat_runs",
        ["lease_expires_at"],
        postgresql_where=sa.text("state = 'running'"),
    )

    op.create_table(
        "beat_leader",
        sa.Column("name", sa.Text, primary_key=True),
        sa.Column("epoch", sa.BigInteger, nullable=False),
        sa.Column("holder", sa.Text, nullable=False),
        sa.Column("acquired_at", TZ, nullable=False, server_default=sa.text("now()")),
    )

    # Wake the leader whenever a schedule changes, however it was changed (API, CLI,
    # psql), except by the claim itself, which marks its transaction with a setting.
    op.execute(
        """
        CREATE FUNCTION beat_notify_schedules_changed() RETURNS trigger
        LANGUAGE plpgsql AS $$
        BEGIN
            IF coalesce(current_setting('beat.claiming', true), '') <> 'on' THEN
                PERFORM pg_notify('beat_schedules_changed', TG_OP);
            END IF;
            RETURN NULL;
        END $$
        """
    )
    op.execute(
        """
        CREATE TRIGGER beat_schedules_changed
        AFTER INSERT OR UPDATE OR DELETE ON beat_schedules
        FOR EACH STATEMENT EXECUTE FUNCTION beat_notify_schedules_changed()
        """
    )


def downgrade() -> None:
    op.execute("DROP TRIGGER IF EXISTS beat_schedules_changed ON beat_schedules")
    op.execute("DROP FUNCTION IF EXISTS beat_notify_schedules_changed()")
    op.drop_table("beat_leader")
    op.drop_table("beat_runs")
    op.drop_table("beat_schedules")
