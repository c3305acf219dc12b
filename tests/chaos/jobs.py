"""Jobs of the chaos workload beyond ``tests.e2e.jobs``, and its code schedules.

- ``chaos.plain`` and ``chaos.plain_retrying``: ordinary Celery tasks (no
  idempotent base), as most real projects have, defined in
  ``tests.chaos.plain_jobs`` so that a worker without this package runs them too.
  They write their effect themselves, in their own transaction: nothing makes it
  commit with the run's record, so the checks see what really ran.
- ``chaos.retrying``: fails a given number of times, then records its effect
  through ``self.db``; half the runs retry through ``autoretry_for``, half
  through ``self.retry(countdown=...)``; each attempt is recorded as it starts
  (``chaos_attempts``), so the checks see a retry that started before its time.
- ``chaos.versioned``: the job of the code schedule a deploy changes; its
  effect names the version of the definition that ran it.
- ``chaos.step`` and ``chaos.gather``: the steps of the workflow schedules (a chord's
  body gathers its header's results). Each records its body's start at once, outside
  the run's transaction (``chaos_attempts``: best effort, so a step whose body ran
  again after an interruption shows), and its effect, with the worker that ran it,
  through ``self.db`` (``e2e_effects``: it commits with the step's success, so the
  checks count each step's executions by its task ID).

Code schedules come from the JSON file named by ``CHAOS_CODE_SCHEDULES`` (a
``beat_schedule`` mapping), read when the module is imported: a beat started
after the harness rewrote the file syncs the new definition, as after a deploy.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from pathlib import Path
from typing import Any

import psycopg
from sqlalchemy import text

from app import celery_app
from beat import IdempotentTask
from tests.chaos.plain_jobs import record_attempt
from tests.chaos.plain_jobs import register as register_plain_jobs
from tests.e2e.jobs import _record_effect

#: Environment variable naming the JSON file of the code schedules.
CODE_SCHEDULES_ENV = "CHAOS_CODE_SCHEDULES"
#: Seconds before an explicit ``self.retry`` runs again, and before an autoretry does.
RETRY_COUNTDOWN = 0.5
AUTORETRY_DELAY = 1


register_plain_jobs(celery_app)


@celery_app.task(
    name="chaos.retrying",
    bind=True,
    base=IdempotentTask,
    autoretry_for=(RuntimeError,),
    retry_backoff=False,
    default_retry_delay=AUTORETRY_DELAY,
    max_retries=3,
)
def retrying(self: IdempotentTask, label: str, failures: int, explicit: bool) -> str:
    """Fails ``failures`` times (``self.retry`` if ``explicit``, else autoretry), then
    records its effect."""
    retries = self.request.retries or 0
    failing = retries < failures
    record_attempt(self, (RETRY_COUNTDOWN if explicit else AUTORETRY_DELAY) if failing else None)
    if failing:
        if explicit:
            raise self.retry(countdown=RETRY_COUNTDOWN)
        raise RuntimeError(f"failure {retries + 1} of {failures}")
    return _record_effect(self, label)


@celery_app.task(name="chaos.versioned", bind=True, base=IdempotentTask)
def versioned(self: IdempotentTask, label: str, version: int) -> str:
    """Records its effect labelled with the definition's version (``label@vN``)."""
    return _record_effect(self, f"{label}@v{version}")


@celery_app.task(name="chaos.step", bind=True, base=IdempotentTask)
def step(self: IdempotentTask, label: str, seconds: float) -> str:
    """A workflow's step: works ``seconds`` (checking its lease), then records its effect."""
    _record_start(self)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        self.check_lease()
        time.sleep(0.1)
    return _record_step_effect(self, label)


@celery_app.task(name="chaos.gather", bind=True, base=IdempotentTask)
def gather(self: IdempotentTask, results: list[Any], label: str) -> int:
    """A chord's body (or the step after a group): records its effect, returns how many
    results it was given."""
    _record_start(self)
    _record_step_effect(self, label)
    return len(results)


def _record_start(task: IdempotentTask) -> None:
    """The body's start, in a transaction of its own; nothing if PostgreSQL is down (the
    count of starts is a figure, not a check: the step must not fail for it)."""
    with contextlib.suppress(psycopg.Error):
        record_attempt(task, None)


def _record_step_effect(task: IdempotentTask, label: str) -> str:
    """The step's effect and the worker that ran it, committed with the step's success."""
    task_id: str = task.request.id
    task.db.execute(
        text("INSERT INTO e2e_effects (task_id, label, worker) VALUES (:task_id, :label, :worker)"),
        {"task_id": task_id, "label": label, "worker": task.request.hostname},
    )
    return task_id


def code_schedules() -> dict[str, Any]:
    """The ``beat_schedule`` entries in the file ``CHAOS_CODE_SCHEDULES`` names (none if unset)."""
    path = os.environ.get(CODE_SCHEDULES_ENV)
    if not path:
        return {}
    entries: dict[str, Any] = json.loads(Path(path).read_text())
    return entries


celery_app.conf.beat_schedule = {**(celery_app.conf.beat_schedule or {}), **code_schedules()}
