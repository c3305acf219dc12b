"""The links of a run not sent yet: while the callbacks and the rest of the chain of a
run on the idempotent base may be unsent, ``beat_runs.unsent_links`` holds the return
value they are sent with (``{"result": ...}``). The completion writes it in the same
statement as ``succeeded``; the worker clears it once it sent them. A second delivery
of a succeeded run that finds it still set, past the lease, sends them (with their task
IDs) instead of dropping them with the duplicate.

A nullable column without a default rewrites nothing.

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-06
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("beat_runs", sa.Column("unsent_links", JSONB))


def downgrade() -> None:
    op.drop_column("beat_runs", "unsent_links")
