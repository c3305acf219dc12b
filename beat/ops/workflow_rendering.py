"""A workflow run's steps as people read them: the canvas as a tree, each step with
what its run recorded (``schedules runs NAME --steps``, its JSON, the UI's run page). A
step not recorded yet (its message not sent: what comes before it has not ended) is
``waiting``."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from beat.errors import InvalidSchedule
from beat.ops.rendering import duration_text, iso, table, time_text
from beat.records import RunRecord
from beat.schedule.workflow import WORKFLOW_TASK, Node, canvas_of, described, outline

#: The state shown for a step whose run is not recorded yet.
WAITING = "waiting"


@dataclass(frozen=True, slots=True)
class StepLine:
    """One line of a workflow run's tree: a container, or a step and its run (None: not
    recorded yet)."""

    node: Node
    run: RunRecord | None

    @property
    def state(self) -> str:
        if self.node.kind != "task":
            return ""
        return WAITING if self.run is None else self.run.state.value


def is_workflow(run: RunRecord) -> bool:
    return run.task == WORKFLOW_TASK


def workflow_label(run: RunRecord) -> str:
    """The run's canvas in one line (``chain(a | b)``)."""
    return described(run.kwargs)


def step_lines(run: RunRecord, steps: Sequence[RunRecord]) -> list[StepLine]:
    """The tree of workflow run ``run``, each step with its recorded run from ``steps``;
    the recorded steps alone, in order, if its canvas cannot be read."""
    by_path = {step.step: step for step in steps}
    try:
        nodes = outline(canvas_of(run.kwargs))
    except InvalidSchedule:
        nodes = [
            Node(path=step.step or "?", depth=0, kind="task", task=step.task) for step in steps
        ]
    return [StepLine(node=node, run=by_path.get(node.path)) for node in nodes]


def steps_table(run: RunRecord, steps: Sequence[RunRecord]) -> str:
    header = ("STEP", "TASK", "STATE", "WORKER", "ATTEMPT", "STARTED", "DURATION", "ERROR")
    rows = [_row(line) for line in step_lines(run, steps)]
    return table(header, rows)


def _row(line: StepLine) -> tuple[str, ...]:
    indent = "  " * line.node.depth
    if line.node.kind != "task":
        return (f"{indent}{line.node.kind} {line.node.path}".rstrip(), "", "", "", "", "", "", "")
    step = line.run
    return (
        f"{indent}{line.node.path}",
        line.node.task or "-",
        line.state,
        "-" if step is None else step.worker or "-",
        "-" if step is None else f"{step.attempt}/{step.max_attempts}",
        "-" if step is None else time_text(step.started_at) if step.started_at else "-",
        "-" if step is None or step.duration_seconds is None else _seconds(step.duration_seconds),
        "" if step is None else (step.error or step.reason or "")[:120],
    )


def _seconds(value: float) -> str:
    return duration_text(timedelta(seconds=value))


def steps_document(run: RunRecord, steps: Sequence[RunRecord]) -> list[dict[str, Any]]:
    """The steps of ``run`` as JSON: each step's path, task, state and its run's times."""
    return [_step_document(line) for line in step_lines(run, steps) if line.node.kind == "task"]


def _step_document(line: StepLine) -> dict[str, Any]:
    step = line.run
    document: dict[str, Any] = {"path": line.node.path, "task": line.node.task, "state": line.state}
    if step is not None:
        document |= {
            "task_id": step.task_id,
            "worker": step.worker,
            "attempt": step.attempt,
            "published_at": iso(step.published_at),
            "started_at": iso(step.started_at),
            "finished_at": iso(step.finished_at),
            "duration_seconds": step.duration_seconds,
            "error": step.error,
        }
    return document
