"""The monitors of each run's timing: a schedule's ``max_runtime`` (a run still running
past it is an ``overran`` incident, and may be revoked), ``late_after`` (a run started
that long after its fire time is a ``late`` incident) and ``missed_after`` (a fire time
not sent within it is a ``missed`` incident); and the notification channels a
schedule's incidents are told to (``channels``; NULL: every channel); an index of the
notifications by incident, for retention; the outcomes a schedule's failing monitor
counts (``failure_states``; NULL: failed, lost and expired); and, on each run, its first
publish and first start and whether an operator made it, which the monitors judge by
(a send again or a retry rewrites ``published_at`` and ``started_at``). Runs from before
have none: the monitors read ``published_at`` and ``started_at`` for them.

Adding columns without a default, and a boolean with a constant default, rewrites
nothing: the schedule table is locked for a moment only.

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-06
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import ARRAY

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None

TZ = sa.DateTime(timezone=True)
_TIMING_COLUMNS = ("max_runtime_seconds", "late_after_seconds", "missed_after_seconds")


def upgrade() -> None:
    for column in _TIMING_COLUMNS:
        op.add_column("beat_schedules", sa.Column(column, sa.Double))
    op.add_column(
        "beat_schedules",
        sa.Column(
            "revoke_after_max_runtime", sa.Boolean, nullable=False, server_default=sa.false()
        ),
    )
    op.add_column("beat_schedules", sa.Column("channels", ARRAY(sa.Text)))
    op.add_column("beat_schedules", sa.Column("failure_states", ARRAY(sa.Text)))
    op.create_check_constraint(
        "ck_beat_schedules_run_monitors",
        "beat_schedules",
        "max_runtime_seconds > 0 AND late_after_seconds > 0 AND missed_after_seconds > 0",
    )
    op.add_column("beat_runs", sa.Column("first_published_at", TZ))
    op.add_column("beat_runs", sa.Column("first_started_at", TZ))
    op.add_column(
        "beat_runs",
        sa.Column("by_operator", sa.Boolean, nullable=False, server_default=sa.false()),
    )
    op.create_index(
        "ix_beat_schedules_timed",
        "beat_schedules",
        ["id"],
        postgresql_where=sa.text(
            "late_after_seconds IS NOT NULL OR missed_after_seconds IS NOT NULL"
        ),
    )
    op.drop_constraint("ck_beat_incidents_kind", "beat_incidents")
    op.create_check_constraint(
        "ck_beat_incidents_kind",
        "beat_incidents",
        "kind IN ('failing', 'stall', 'overran', 'late', 'missed')",
    )
    # Retention deletes resolved incidents: each one's notifications are found by it
    # (without this index, a scan of the outbox per incident).
    op.create_index("ix_beat_notifications_incident", "beat_notifications", ["incident_id"])


def downgrade() -> None:
    op.drop_index("ix_beat_notifications_incident", "beat_notifications")
    op.execute("DELETE FROM beat_incidents WHERE kind IN ('overran', 'late', 'missed')")
    op.drop_constraint("ck_beat_incidents_kind", "beat_incidents")
    op.create_check_constraint(
        "ck_beat_incidents_kind", "beat_incidents", "kind IN ('failing', 'stall')"
    )
    op.drop_index("ix_beat_schedules_timed", "beat_schedules")
    for column in ("by_operator", "first_started_at", "first_published_at"):
        op.drop_column("beat_runs", column)
    op.drop_constraint("ck_beat_schedules_run_monitors", "beat_schedules")
    op.drop_column("beat_schedules", "failure_states")
    op.drop_column("beat_schedules", "channels")
    op.drop_column("beat_schedules", "revoke_after_max_runtime")
    for column in _TIMING_COLUMNS:
        op.drop_column("beat_schedules", column)
