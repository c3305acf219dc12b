"""Workflow runs: ``beat_runs.workflow_run_id`` and ``step`` link a step (a run of its
own, recorded when its message is sent) to the workflow run it belongs to, and a
trigger moves the workflow run with its steps, in the transaction of the step's
change, whoever makes it (a worker, the reaper, an operator):

- a step that starts makes its workflow ``running`` (started at the first step's start);
- a step that fails, expires, is cancelled or lost ends its workflow ``failed``
  (``lost``, ``cancelled``) with the step named in the error;
- a step that succeeds ends its workflow ``succeeded`` once every end step of the
  canvas (``kwargs->'ends'``, ``beat.schedule.workflow.plan``) has succeeded.

The workflow's row is locked before its steps are read: two end steps that succeed
at once (the members of a group) are counted one after the other, each transaction
reading the other's committed step, so the last of them ends the run.

Revision ID: 0021
Revises: 0020
Create Date: 2026-12-07
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import UUID

revision = "0021"
down_revision = "0020"
branch_labels = None
depends_on = None

FINISHED = "('succeeded', 'failed', 'lost', 'skipped', 'cancelled', 'expired')"

FUNCTION = f"""
CREATE FUNCTION beat_follow_workflow_step() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    workflow beat_runs%ROWTYPE;
    ended text;
BEGIN
    SELECT * INTO workflow FROM beat_runs WHERE id = NEW.workflow_run_id FOR UPDATE;
    IF NOT FOUND OR workflow.state IN {FINISHED} THEN
        RETURN NULL;
    END IF;
    IF NEW.state = 'running' THEN
        UPDATE beat_runs SET
            state = 'running',
            attempt = greatest(attempt, 1),
            published_at = coalesce(published_at, NEW.published_at, now()),
            first_published_at = coalesce(first_published_at, NEW.published_at, now()),
            received_at = coalesce(received_at, now()),
            started_at = coalesce(started_at, now()),
            first_started_at = coalesce(first_started_at, now()),
            worker = coalesce(worker, NEW.worker)
        WHERE id = workflow.id AND state <> 'running';
        RETURN NULL;
    END IF;
    IF NEW.state = 'succeeded' THEN
        IF EXISTS (
            SELECT 1 FROM jsonb_array_elements_text(workflow.kwargs->'ends') AS ends(path)
            WHERE NOT EXISTS (
                SELECT 1 FROM beat_runs AS step
                WHERE step.workflow_run_id = workflow.id
                  AND step.step = ends.path
                  AND step.state = 'succeeded'
            )
        ) THEN
            RETURN NULL;
        END IF;
        ended := 'succeeded';
    ELSIF NEW.state IN ('failed', 'expired') THEN
        ended := 'failed';
    ELSIF NEW.state IN ('lost', 'cancelled') THEN
        ended := NEW.state;
    ELSE
        RETURN NULL;
    END IF;
    UPDATE beat_runs SET
        state = ended,
        finished_at = now(),
        duration_seconds = extract(epoch FROM now() - coalesce(started_at, now())),
        lease_owner = NULL,
        lease_expires_at = NULL,
        error = CASE WHEN ended = 'succeeded' THEN NULL ELSE left(format(
            'step %s (%s) %s: %s', NEW.step, NEW.task, NEW.state,
            coalesce(NEW.error, NEW.reason, 'no error recorded')
        ), 4000) END
    WHERE id = workflow.id;
    RETURN NULL;
END $$
"""


def upgrade() -> None:
    op.add_column("beat_runs", sa.Column("workflow_run_id", UUID(as_uuid=True)))
    op.add_column("beat_runs", sa.Column("step", sa.Text))
    op.create_index(
        "ix_beat_runs_workflow_steps",
        "beat_runs",
        ["workflow_run_id", "step"],
        postgresql_where=sa.text("workflow_run_id IS NOT NULL"),
    )
    # The leader's re-send of links left undone reads these rows every pass.
    op.create_index(
        "ix_beat_runs_links_unsent",
        "beat_runs",
        ["finished_at"],
        postgresql_where=sa.text("unsent_links IS NOT NULL"),
    )
    op.execute(FUNCTION)
    op.execute(
        "CREATE TRIGGER beat_runs_workflow_step AFTER UPDATE OF state ON beat_runs"
        " FOR EACH ROW WHEN (NEW.workflow_run_id IS NOT NULL AND OLD.state <> NEW.state)"
        " EXECUTE FUNCTION beat_follow_workflow_step()"
    )


def downgrade() -> None:
    op.execute("DROP TRIGGER IF EXISTS beat_runs_workflow_step ON beat_runs")
    op.execute("DROP FUNCTION IF EXISTS beat_follow_workflow_step()")
    op.drop_index("ix_beat_runs_links_unsent", table_name="beat_runs")
    op.drop_index("ix_beat_runs_workflow_steps", table_name="beat_runs")
    op.drop_column("beat_runs", "step")
    op.drop_column("beat_runs", "workflow_run_id")
