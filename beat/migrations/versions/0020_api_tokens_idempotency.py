"""The write API's tables: ``beat_api_tokens``, the API tokens (stored as the SHA-256
of the token, which is shown once; each with a role and who made it; revoked, never
deleted, so its name cannot be taken again by another), and
``beat_idempotency_keys``, the ``Idempotency-Key`` of each create, with the hash of
its request and the schedule it made: a retried create returns that schedule
instead of making a second. Keys are pruned with the finished runs.

Revision ID: 0020
Revises: 0019
Create Date: 2026-12-07
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0020"
down_revision = "0019"
branch_labels = None
depends_on = None

TZ = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "beat_api_tokens",
        sa.Column("name", sa.Text, primary_key=True),
        sa.Column("role", sa.Text, nullable=False),
        sa.Column("token_hash", sa.Text, nullable=False, unique=True),
        sa.Column("created_at", TZ, nullable=False, server_default=sa.text("now()")),
        sa.Column("created_by", sa.Text, nullable=False),
        sa.Column("revoked_at", TZ),
        sa.Column("last_used_at", TZ),
        sa.CheckConstraint(
            "role IN ('viewer', 'operator', 'admin')", name="ck_beat_api_tokens_role"
        ),
    )
    op.create_table(
        "beat_idempotency_keys",
        sa.Column("key", sa.Text, primary_key=True),
        sa.Column("request_hash", sa.Text, nullable=False),
        sa.Column("schedule_name", sa.Text, nullable=False),
        sa.Column("created_at", TZ, nullable=False, server_default=sa.text("now()")),
    )
    op.create_index("ix_beat_idempotency_keys_created_at", "beat_idempotency_keys", ["created_at"])


def downgrade() -> None:
    op.drop_table("beat_idempotency_keys")
    op.drop_table("beat_api_tokens")
