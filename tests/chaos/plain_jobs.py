"""The chaos workload's plain Celery tasks (no idempotent base), written so that a
worker without this package can run them too.

This module imports neither ``beat`` nor ``app``: the package's workers register
the tasks through ``tests.chaos.jobs``, the worker without the package
(``tests.chaos.foreign_worker``) on its own app, under the same names. Every
execution writes what it did in its own transaction, with the name of the worker
that did it, so the checks count executions on every worker alike:

- ``chaos_attempts``: one row per attempt as it starts (the task's retry count,
  the countdown it will ask for if it fails, the database's time);
- ``e2e_effects``: one row per execution that finished.

Both retry when their database is unreachable (a PostgreSQL restart), as a real
project would.
"""

from __future__ import annotations

import os
import time
from typing import Any

import psycopg

#: The queue the plain tasks go to: the workers with and without the package consume it.
PLAIN_QUEUE = "plain"
#: Seconds a plain retry waits: longer than a dead worker's lease takes to expire and
#: be reaped, so a copy sent before its time is seen early.
PLAIN_RETRY_COUNTDOWN = 10.0
#: Autoretry settings for a database restart (the attempt is recorded again then).
DATABASE_RETRY = {
    "autoretry_for": (psycopg.OperationalError,),
    "retry_backoff": False,
    "default_retry_delay": 1,
    "max_retries": 10,
}


def _execute(statement: str, params: tuple[Any, ...]) -> None:
    with psycopg.connect(os.environ["E2E_EFFECTS_DSN"], autocommit=True, connect_timeout=5) as conn:
        conn.execute(statement, params)


def record_effect(task: Any, label: str) -> str:
    """One finished execution of ``task``, with the worker that ran it."""
    task_id: str = task.request.id
    _execute(
        "INSERT INTO e2e_effects (task_id, label, worker) VALUES (%s, %s, %s)",
        (task_id, label, task.request.hostname),
    )
    return task_id


def record_attempt(task: Any, countdown: float | None) -> None:
    """An attempt starting now (the database's time), and the countdown of its retry."""
    _execute(
        "INSERT INTO chaos_attempts (task_id, retries, countdown, worker) VALUES (%s, %s, %s, %s)",
        (task.request.id, task.request.retries or 0, countdown, task.request.hostname),
    )


def register(app: Any) -> None:
    """Define the plain tasks on ``app``."""

    @app.task(name="chaos.plain", bind=True, **DATABASE_RETRY)  # type: ignore[misc]
    def plain(self: Any, label: str, seconds: float) -> str:
        """Works for ``seconds``, then commits its effect in a transaction of its own."""
        time.sleep(seconds)
        return record_effect(self, label)

    @app.task(name="chaos.plain_retrying", bind=True, **DATABASE_RETRY)  # type: ignore[misc]
    def plain_retrying(self: Any, label: str, failures: int, countdown: float) -> str:
        """Asks for a retry ``countdown`` s later ``failures`` times, then records its effect."""
        retries = self.request.retries or 0
        failing = retries < failures
        record_attempt(self, countdown if failing else None)
        if failing:
            raise self.retry(countdown=countdown)
        return record_effect(self, label)
