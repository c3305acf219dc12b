"""Faults injected into the workers of tests/e2e/test_workflow_faults.py (imported by
them through ``HABEAT_IMPORTS``, next to ``tests.e2e.jobs``); each fires once, marked
by a file under ``E2E_MARKS``."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

from celery import current_task
from celery.backends.redis import RedisBackend

from app import celery_app
from beat import IdempotentTask
from beat.errors import StoreUnavailable
from beat.store import workflow_steps
from beat.store.runs import RunStore
from tests.e2e.jobs import _record_effect

MARKS = Path(os.environ.get("E2E_MARKS", "/nonexistent"))


def _first_time(name: str) -> bool:
    """True the first time ``name`` is asked for, across the worker's processes."""
    MARKS.mkdir(parents=True, exist_ok=True)
    try:
        (MARKS / name).touch(exist_ok=False)
    except FileExistsError:
        return False
    return True


@celery_app.task(name="e2e.die_before_chord_count", bind=True, base=IdempotentTask)
def die_before_chord_count(self: IdempotentTask, label: str) -> str:
    """An ordinary idempotent step; the first time, its worker is killed after its
    completion committed and before its chord counted it."""
    return _record_effect(self, label)


_part_return = RedisBackend.on_chord_part_return


def _dying_part_return(self: Any, request: Any, state: Any, result: Any, **options: Any) -> Any:
    if getattr(request, "task", None) == "e2e.die_before_chord_count" and _first_time(
        f"died-{request.id}"
    ):
        os.kill(os.getpid(), signal.SIGKILL)
    return _part_return(self, request, state, result, **options)


RedisBackend.on_chord_part_return = _dying_part_return  # type: ignore[method-assign]

_record_step = workflow_steps.WorkflowSteps.record_step
#: The step whose records fail twice (at its send and at its receipt), as when
#: PostgreSQL is unreachable then and back when the step starts.
UNRECORDED_STEP = os.environ.get("E2E_UNRECORDED_STEP")


def _record_step_failing(self: Any, message: Any) -> bool:
    if message.step == UNRECORDED_STEP and (
        _first_time(f"unrecorded-{message.task_id}-1")
        or _first_time(f"unrecorded-{message.task_id}-2")
    ):
        raise StoreUnavailable("PostgreSQL unreachable for this write (injected)")
    return bool(_record_step(self, message))


workflow_steps.WorkflowSteps.record_step = _record_step_failing  # type: ignore[method-assign]


@celery_app.task(name="e2e.unrecorded_outcome_once", bind=True, base=IdempotentTask)
def unrecorded_outcome_once(self: IdempotentTask, label: str) -> str:
    """An ordinary idempotent step whose first outcome PostgreSQL cannot take."""
    return _record_effect(self, label)


_finish = RunStore.finish


def _finish_failing_once(self: Any, run_id: Any, **values: Any) -> Any:
    task = current_task
    if (
        task is not None
        and task.name == "e2e.unrecorded_outcome_once"
        and _first_time(f"unfinished-{run_id}")
    ):
        raise StoreUnavailable("PostgreSQL unreachable for this outcome (injected)")
    return _finish(self, run_id, **values)


RunStore.finish = _finish_failing_once  # type: ignore[method-assign]
