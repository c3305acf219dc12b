"""The steps of workflow runs (``beat.schedule.workflow``): each step is a run of its
own in ``beat_runs``, with ``workflow_run_id`` and ``step`` naming the workflow run and
its path. A step's row is made when its message is sent (``record_step``, from
whichever process sends it: beat for the first steps, a worker for the next ones),
and, should that write have failed, when a worker receives it: from then on it is a
run like any beat published, received, guarded, reclaimed and ended by the same
statements. The workflow run follows its steps (migration 0021's trigger).

What the leader's recovery must not do to a workflow run itself: it has no message of
its own, so once any of its steps is recorded, its steps are what is looked for and
sent again (``has_no_recorded_step``)."""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import (
    ColumnElement,
    Connection,
    Row,
    any_,
    bindparam,
    case,
    exists,
    func,
    or_,
    select,
    update,
)
from sqlalchemy.dialects.postgresql import ARRAY, UUID
from sqlalchemy.dialects.postgresql import insert as pg_insert

from beat.models import ACTIVE_STATES, FINISHED_STATES, RunState
from beat.records import RunRecord
from beat.schedule.workflow import WORKFLOW_TASK
from beat.store.db import StoreConnection
from beat.store.rows import record_from_row
from beat.store.tables import runs

#: Attempts a step has when its workflow run cannot be read (pruned).
DEFAULT_STEP_ATTEMPTS = 3
#: Why the reaper ends a workflow run that can no longer end by itself.
STALLED = (
    "no step of it waits or runs, and none moved for twice the visibility timeout: the"
    " step after the last one that ended was never sent (its sender died before it"
    " could), so the workflow cannot go on"
)
#: Why a step sent after its workflow run ended is not run.
WORKFLOW_ENDED = "its workflow run had ended when it was sent: not run"


@dataclass(frozen=True, kw_only=True, slots=True)
class StepMessage:
    """A step's message as it is sent (or received): what its run row keeps, so that the
    step can be published again alone, with its place in the canvas (its chain, chord and
    group options)."""

    task_id: str
    workflow_run_id: uuid.UUID
    step: str
    task: str
    args: list[Any]
    kwargs: dict[str, Any]
    options: dict[str, Any] = field(default_factory=dict)
    #: Seconds until it is due (a countdown, an ETA); None: at once. A step sent again
    #: (its worker died holding it) is not sent before.
    due_in: float | None = None


class WorkflowSteps(StoreConnection):
    """Steps recorded as they are sent, and read as their workflow's tree."""

    def record_step(self, message: StepMessage) -> bool:
        """Make the step's run, ``queued``, unless it exists (a message sent again, a
        receipt after the send recorded it); True if this call made it. A step of a
        workflow run that has ended (a step before it failed or was lost, a newer run
        or a pause cancelled it) or is gone is made ``cancelled``: whoever receives it
        does not run it."""
        workflow = runs.alias("workflow")
        of_workflow = select(workflow).where(workflow.c.id == message.workflow_run_id)
        attempts = of_workflow.with_only_columns(workflow.c.max_attempts).scalar_subquery()
        # Ended, or gone: withdrawn by an edit before its fire time (a leader may still
        # send a canvas it had built), or pruned long after it ended.
        now_in = of_workflow.with_only_columns(workflow.c.state).scalar_subquery()
        ended = func.coalesce(now_in, RunState.CANCELLED.value).in_(
            [state.value for state in FINISHED_STATES]
        )
        due = func.now() + func.make_interval(0, 0, 0, 0, 0, 0, message.due_in or 0.0)
        statement = (
            pg_insert(runs)
            .values(
                id=uuid.UUID(message.task_id),
                task=message.task,
                args=message.args,
                kwargs=message.kwargs,
                options=message.options,
                state=case((ended, RunState.CANCELLED.value), else_=RunState.QUEUED.value),
                reason=case((ended, WORKFLOW_ENDED), else_=None),
                finished_at=case((ended, func.now()), else_=None),
                workflow_run_id=message.workflow_run_id,
                step=message.step,
                max_attempts=func.coalesce(attempts, DEFAULT_STEP_ATTEMPTS),
                not_before=None if message.due_in is None else due,
                published_at=func.now(),
                first_published_at=func.now(),
            )
            .on_conflict_do_nothing(index_elements=[runs.c.id])
            .returning(runs.c.id)
        )
        with self._each_statement_commits() as conn:
            return conn.execute(statement).scalar_one_or_none() is not None

    def steps(self, workflow_run_id: uuid.UUID) -> list[RunRecord]:
        """The recorded steps of a workflow run, in the order of their paths."""
        query = select(runs).where(runs.c.workflow_run_id == workflow_run_id)
        with self._transaction() as conn:
            found = [record_from_row(row) for row in conn.execute(query)]
        return sorted(found, key=lambda record: path_order(record.step or ""))


def path_order(path: str) -> tuple[tuple[int, int], ...]:
    """A step path as a sort key: ``2.h.10`` after ``2.h.9``, a chord's header (``h``)
    before its body (``b``)."""
    return tuple(
        (0, int(part)) if part.isdigit() else (1, _CHORD_PARTS.get(part, len(_CHORD_PARTS)))
        for part in path.split(".")
    )


#: The parts of a chord in a path, in the order they run.
_CHORD_PARTS = {"h": 0, "b": 1}


def cancel_steps_of(conn: Connection, workflow_run_ids: Sequence[uuid.UUID], why: str) -> list[str]:
    """Cancel the steps not yet ended of workflow runs that were ended from outside their
    steps (a newer run cancelled them, they ran past their ``max_runtime``), in the
    caller's transaction; their task IDs, to revoke. A step's worker then finds its run
    cancelled: a step not started never starts, a running one's completion is refused."""
    if not workflow_run_ids:
        return []
    ended = conn.execute(
        update(runs)
        .where(
            runs.c.workflow_run_id == any_(bindparam("ids", type_=ARRAY(UUID(as_uuid=True)))),
            runs.c.state.in_([state.value for state in ACTIVE_STATES]),
        )
        .values(
            state=RunState.CANCELLED.value,
            reason=why,
            finished_at=func.now(),
            lease_owner=None,
            lease_expires_at=None,
        )
        .returning(runs.c.id),
        {"ids": list(workflow_run_ids)},
    )
    return [str(step_id) for step_id in ended.scalars()]


def end_stalled_workflows(conn: Connection, older_than: float) -> list[Row[Any]]:
    """End ``lost`` the workflow runs that can no longer end by themselves, in the
    reaper's transaction: ``running``, none of their recorded steps waiting or running,
    and none sent, started or ended for ``older_than`` seconds (the reaper's bound for a
    message presumed gone: twice the visibility timeout), so the step that should come
    next was never sent (its sender died between the step before and the send, and no
    record of it is left to send again). Their rows, for the reaper's report."""
    step = runs.alias("step")
    of_it = step.c.workflow_run_id == runs.c.id
    last_moved = (
        select(func.max(func.greatest(step.c.finished_at, step.c.started_at, step.c.published_at)))
        .where(of_it)
        .scalar_subquery()
    )
    idle_since = func.coalesce(last_moved, runs.c.started_at, runs.c.published_at)
    stalled = (
        update(runs)
        .where(
            runs.c.task == WORKFLOW_TASK,
            runs.c.state == RunState.RUNNING.value,
            ~exists().where(of_it, step.c.state.in_([state.value for state in ACTIVE_STATES])),
            idle_since < func.now() - func.make_interval(0, 0, 0, 0, 0, 0, older_than),
        )
        .values(
            state=RunState.LOST.value,
            finished_at=func.now(),
            duration_seconds=func.extract("epoch", func.now() - runs.c.started_at),
            error=STALLED,
        )
        .returning(*runs.c, func.now().label("now"))
    )
    return list(conn.execute(stalled))


def has_no_recorded_step() -> ColumnElement[bool]:
    """A run that is not a workflow run, or one none of whose steps is recorded yet: what
    the leader may send again when its message seems lost. A workflow with a recorded
    step is left to its steps, which are looked for and sent again themselves."""
    step = runs.alias("recorded_step")
    return or_(
        runs.c.task != WORKFLOW_TASK,
        ~exists().where(step.c.workflow_run_id == runs.c.id),
    )


def step_options(options: Mapping[str, Any]) -> dict[str, Any]:
    """Plain JSON of a step's options (what a JSONB column keeps)."""
    return {key: value for key, value in options.items() if value not in (None, [], {})}
