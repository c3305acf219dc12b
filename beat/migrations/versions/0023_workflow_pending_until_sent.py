"""A workflow run still ``pending`` is not moved to ``running`` by its first step's
start: it stays in the outbox until its sender marks it published.

The leader sends a workflow's first steps one message after another, then marks the
run published (``pending`` -> ``queued``, ``OutboxStatements.mark_published``). A
leader killed between two of those messages left a step running and the others
unsent; the trigger of 0021 had moved the run to ``running`` at that step's start, so
no leader sent it again and it waited for the reaper's stalled-workflow rule (twice the
visibility timeout). Left ``pending``, the next leader's outbox sends the whole canvas
again with the same derived task IDs: the steps already sent are refused by their
guard or receipt, the others run. ``mark_published`` moves a workflow whose steps
already started straight to ``running``.

Revision ID: 0023
Revises: 0022
Create Date: 2026-12-07
"""

from __future__ import annotations

from alembic import op

revision = "0023"
down_revision = "0022"
branch_labels = None
depends_on = None

FINISHED = "('succeeded', 'failed', 'lost', 'skipped', 'cancelled', 'expired')"


def _function(not_moved: str) -> str:
    """The trigger function of 0021, a step's start moving its workflow run to
    ``running`` unless the run is in ``not_moved``."""
    return f"""
CREATE OR REPLACE FUNCTION beat_follow_workflow_step() RETURNS trigger
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
        WHERE id = workflow.id AND state NOT IN {not_moved};
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
    op.execute(_function("('running', 'pending')"))


def downgrade() -> None:
    op.execute(_function("('running')"))
