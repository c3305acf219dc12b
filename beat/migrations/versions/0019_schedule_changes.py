"""The audit log of schedules: ``beat_schedule_changes``, one row per change to a
schedule's fields, written by triggers on ``beat_schedules`` in the transaction of
the change, whoever made it (the API, the CLI, the UI, a code sync, an import, the
scheduler itself, or psql); and ``beat_schedules.version``, raised by each change.

Who made it is told by the writer in the transaction-local setting
``habeat.change`` (a JSON object: actor, entry, host, address, note, and an action
that overrides the trigger's own reading). Without it, a quarantine is the
scheduler's (``system:quarantine``), anything else the database user's
(``sql:<user>``, from the client's address as PostgreSQL sees it).

A claim's own writes (the next fire time, the last, the run count) are not changes:
the update trigger's WHEN clause leaves them out. A transaction that records its
changes itself, set-wise, sets ``habeat.recorded`` (a claim: the schedules it ends
or quarantines; ``beat.store.schedule_changes``), and the trigger leaves it alone: a
row trigger costs tens of microseconds a row, which 100,000 one-offs firing at once
would pay in one claim.

Revision ID: 0019
Revises: 0018
Create Date: 2026-12-07
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision = "0019"
down_revision = "0018"
branch_labels = None
depends_on = None

TZ = sa.DateTime(timezone=True)

#: Columns of beat_schedules that a claim writes or that only the database sets: not
#: part of what a change records (``beat.store.schedule_changes.UNRECORDED``).
UNRECORDED = (
    "id",
    "next_fire_at",
    "last_fire_at",
    "runs_count",
    "created_at",
    "updated_at",
    "version",
)
#: The columns of beat_schedules at this revision whose change is recorded. A later
#: revision that adds a column to beat_schedules creates the update trigger again.
RECORDED = (
    "name",
    "task",
    "trigger_kind",
    "cron",
    "cron_both_days",
    "every_seconds",
    "anchor_at",
    "run_at",
    "timezone",
    "args",
    "kwargs",
    "options",
    "enabled",
    "origin",
    "code_hash",
    "misfire_policy",
    "max_attempts",
    "overlap_policy",
    "jitter_seconds",
    "start_at",
    "end_at",
    "max_runs",
    "disabled_reason",
    "quarantined_at",
    "source",
    "source_id",
    "description",
    "alert_after_failures",
    "pause_after_failures",
    "failure_states",
    "max_runtime_seconds",
    "revoke_after_max_runtime",
    "late_after_seconds",
    "missed_after_seconds",
    "channels",
)

ACTIONS = (
    "create",
    "update",
    "pause",
    "resume",
    "delete",
    "restore",
    "quarantine",
    "end",
    "trigger",
    "backfill",
)
ENTRIES = ("cli", "python", "ui", "api", "code", "import", "system", "sql")


def _in(column: str, values: tuple[str, ...]) -> str:
    return f"{column} IN ({', '.join(repr(value) for value in values)})"


FUNCTION = f"""
CREATE FUNCTION beat_record_schedule_change() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    unrecorded CONSTANT text[] := ARRAY[{", ".join(repr(name) for name in UNRECORDED)}];
    given jsonb := nullif(current_setting('habeat.change', true), '')::jsonb;
    what text;
    before_fields jsonb;
    after_fields jsonb;
BEGIN
    IF TG_OP = 'INSERT' THEN
        -- A name made again goes on from its last version in the log: a version
        -- names one change of that name, whichever schedule had it.
        NEW.version := coalesce(
            (SELECT max(version) FROM beat_schedule_changes WHERE schedule_name = NEW.name), 0
        ) + 1;
        what := 'create';
    ELSIF TG_OP = 'DELETE' THEN
        what := 'delete';
    ELSE
        NEW.version := OLD.version + 1;
        what := CASE
            WHEN OLD.quarantined_at IS NULL AND NEW.quarantined_at IS NOT NULL THEN 'quarantine'
            WHEN OLD.enabled AND NOT NEW.enabled THEN 'pause'
            WHEN NEW.enabled AND NOT OLD.enabled THEN 'resume'
            ELSE 'update'
        END;
    END IF;
    IF TG_OP <> 'INSERT' THEN
        before_fields := to_jsonb(OLD) - unrecorded;
    END IF;
    IF TG_OP <> 'DELETE' THEN
        after_fields := to_jsonb(NEW) - unrecorded;
    END IF;
    IF given IS NULL AND what = 'quarantine' THEN
        given := jsonb_build_object('actor', 'system:' || what, 'entry', 'system');
    END IF;
    INSERT INTO beat_schedule_changes
        (schedule_name, version, action, actor, entry, host, address, note, before, after)
    VALUES (
        CASE WHEN TG_OP = 'DELETE' THEN OLD.name ELSE NEW.name END,
        CASE WHEN TG_OP = 'DELETE' THEN OLD.version ELSE NEW.version END,
        coalesce(given->>'action', what),
        coalesce(given->>'actor', 'sql:' || session_user),
        coalesce(given->>'entry', 'sql'),
        given->>'host',
        CASE WHEN given IS NULL THEN host(inet_client_addr()) ELSE given->>'address' END,
        given->>'note',
        before_fields,
        after_fields
    );
    IF TG_OP = 'DELETE' THEN
        RETURN OLD;
    END IF;
    RETURN NEW;
END $$
"""

_OLD = ", ".join(f"OLD.{name}" for name in RECORDED)
_NEW = ", ".join(f"NEW.{name}" for name in RECORDED)
#: A change of a recorded column, or a schedule that stops or starts having a next
#: fire time (a one-off that fired, a window that ended), in a transaction that does
#: not record its changes itself.
UPDATE_WHEN = (
    "coalesce(current_setting('habeat.recorded', true), '') <> 'on'"
    f" AND (ROW({_OLD}) IS DISTINCT FROM ROW({_NEW})"
    " OR (OLD.next_fire_at IS NULL) <> (NEW.next_fire_at IS NULL))"
)


def upgrade() -> None:
    op.add_column(
        "beat_schedules",
        sa.Column("version", sa.Integer, nullable=False, server_default=sa.text("1")),
    )
    op.create_table(
        "beat_schedule_changes",
        sa.Column("id", sa.BigInteger, sa.Identity(always=True), primary_key=True),
        sa.Column("schedule_name", sa.Text, nullable=False),
        sa.Column("version", sa.Integer, nullable=False),
        sa.Column("changed_at", TZ, nullable=False, server_default=sa.text("now()")),
        sa.Column("action", sa.Text, nullable=False),
        sa.Column("actor", sa.Text, nullable=False),
        sa.Column("entry", sa.Text, nullable=False),
        sa.Column("host", sa.Text),
        sa.Column("address", sa.Text),
        sa.Column("note", sa.Text),
        sa.Column("before", JSONB),
        sa.Column("after", JSONB),
        sa.CheckConstraint(_in("action", ACTIONS), name="ck_beat_schedule_changes_action"),
        sa.CheckConstraint(_in("entry", ENTRIES), name="ck_beat_schedule_changes_entry"),
    )
    op.create_index(
        "ix_beat_schedule_changes_schedule",
        "beat_schedule_changes",
        ["schedule_name", "id"],
    )
    op.create_index("ix_beat_schedule_changes_changed_at", "beat_schedule_changes", ["changed_at"])
    op.execute(FUNCTION)
    for event in ("INSERT", "DELETE"):
        op.execute(
            f"CREATE TRIGGER beat_schedules_recorded_{event.lower()}"
            f" BEFORE {event} ON beat_schedules"
            " FOR EACH ROW EXECUTE FUNCTION beat_record_schedule_change()"
        )
    op.execute(
        "CREATE TRIGGER beat_schedules_recorded_update BEFORE UPDATE ON beat_schedules"
        f" FOR EACH ROW WHEN ({UPDATE_WHEN}) EXECUTE FUNCTION beat_record_schedule_change()"
    )


def downgrade() -> None:
    for event in ("insert", "update", "delete"):
        op.execute(f"DROP TRIGGER IF EXISTS beat_schedules_recorded_{event} ON beat_schedules")
    op.execute("DROP FUNCTION IF EXISTS beat_record_schedule_change()")
    op.drop_table("beat_schedule_changes")
    op.drop_column("beat_schedules", "version")
