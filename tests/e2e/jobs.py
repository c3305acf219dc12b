"""Jobs used by the end-to-end tests. Each writes its effect through the task's
session, so it commits with the run's completion: a test can count how often
every run's effect happened."""

from __future__ import annotations

import os
import signal
import time
from typing import Any

import psycopg
from celery.signals import worker_init, worker_process_init
from celery.worker import state as worker_state
from celery.worker.control import control_command
from kombu.exceptions import OperationalError
from sqlalchemy import text

from app import celery_app
from beat import IdempotentTask


def _record_effect(task: IdempotentTask, label: str) -> str:
    task_id: str = task.request.id
    task.db.execute(
        text("INSERT INTO e2e_effects (task_id, label) VALUES (:task_id, :label)"),
        {"task_id": task_id, "label": label},
    )
    return task_id


@celery_app.task(name="e2e.record", bind=True, base=IdempotentTask)
def record(self: IdempotentTask, label: str) -> str:
    return _record_effect(self, label)


@celery_app.task(name="e2e.slow", bind=True, base=IdempotentTask)
def slow(self: IdempotentTask, label: str, seconds: float) -> str:
    """Works for ``seconds``, checking its lease between steps, then records its effect."""
    return _work_then_record(self, label, seconds)


def _work_then_record(task: IdempotentTask, label: str, seconds: float) -> str:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        task.check_lease()
        time.sleep(0.2)
    return _record_effect(task, label)


@celery_app.task(name="e2e.long", bind=True, base=IdempotentTask)
def long(self: IdempotentTask, label: str, seconds: float) -> str:
    """``e2e.slow`` whose every start is recorded at once, outside the run's transaction
    (``<label>:start``): a test counts the bodies started, not only the effects."""
    _record_plain_effect(self.request.id, f"{label}:start")
    return _work_then_record(self, label, seconds)


@celery_app.task(
    name="e2e.flaky",
    bind=True,
    base=IdempotentTask,
    autoretry_for=(RuntimeError,),
    retry_backoff=0.2,
    retry_jitter=False,
    max_retries=3,
)
def flaky(self: IdempotentTask, label: str, failures: int) -> str:
    """Fails ``failures`` times (Celery autoretry), then records its effect."""
    if self.request.retries < failures:
        raise RuntimeError(f"failure {self.request.retries + 1} of {failures}")
    return _record_effect(self, label)


@celery_app.task(
    name="e2e.retry_now",
    bind=True,
    base=IdempotentTask,
    max_retries=5,
)
def retry_now(self: IdempotentTask, label: str, failures: int, countdown: float = 0) -> str:
    """Asks Celery for a retry ``failures`` times (after ``countdown`` s), then records its
    effect: with no countdown the retry may reach a worker before this attempt ends."""
    if self.request.retries < failures:
        raise self.retry(countdown=countdown)
    return _record_effect(self, label)


@control_command()  # type: ignore[untyped-decorator]
def e2e_lose_eta_timers(state: Any) -> dict[str, int]:
    """Cancel the timer entries of the requests this worker holds for their ETA, and keep
    them listed as waiting: a worker that lost them, as Celery can around a lost broker
    connection (it then never runs them, and nothing hands their messages back before the
    visibility timeout)."""
    cancelled = 0
    for request in list(worker_state.scheduled_requests):
        entry = getattr(request, "_eta_timer_entry", None)
        if entry is not None:
            entry.cancel()
            cancelled += 1
    return {"cancelled": cancelled}


@celery_app.task(name="e2e.gather", bind=True, base=IdempotentTask)
def gather(self: IdempotentTask, results: list[Any], label: str) -> int:
    """A chord's body: records its effect, returns how many results it gathered."""
    _record_effect(self, label)
    return len(results)


@celery_app.task(name="e2e.fail", bind=True, base=IdempotentTask)
def fail(self: IdempotentTask, label: str) -> None:
    """An idempotent task that fails every time, after recording that it started."""
    _record_plain_effect(self.request.id, f"{label}:start")
    raise RuntimeError(f"{label}: fails every time")


# -- plain tasks: no idempotent base, as most existing projects write them ---------------


def _record_plain_effect(task_id: str, label: str) -> str:
    """A plain task's effect, written in its own transaction (not with the run's record)."""
    with psycopg.connect(os.environ["E2E_EFFECTS_DSN"], autocommit=True) as conn:
        conn.execute("INSERT INTO e2e_effects (task_id, label) VALUES (%s, %s)", (task_id, label))
    return task_id


@celery_app.task(name="e2e.plain_record", bind=True)
def plain_record(self: Any, label: str) -> str:
    return _record_plain_effect(self.request.id, label)


@celery_app.task(name="e2e.plain_fail")
def plain_fail(label: str) -> None:
    """A plain task that fails every time."""
    raise RuntimeError(f"{label}: fails every time")


@celery_app.task(name="e2e.plain_slow", bind=True)
def plain_slow(self: Any, label: str, seconds: float) -> str:
    time.sleep(seconds)
    return _record_plain_effect(self.request.id, label)


@celery_app.task(name="e2e.plain_flaky", bind=True, max_retries=3)
def plain_flaky(self: Any, label: str, failures: int) -> str:
    """A plain task that retries ``failures`` times at once, then records its effect."""
    if self.request.retries < failures:
        raise self.retry(countdown=0)
    return _record_plain_effect(self.request.id, label)


@celery_app.task(name="e2e.plain_retry_later", bind=True, max_retries=3)
def plain_retry_later(self: Any, label: str, countdown: float) -> str:
    """A plain task that asks for one retry ``countdown`` s later; each attempt records
    its start (the database's clock), labelled with its retry count."""
    _record_plain_effect(self.request.id, f"{label}:{self.request.retries}")
    if self.request.retries < 1:
        raise self.retry(countdown=countdown)
    return self.request.id


def _retry_on(task: Any, label: str, countdown: float, queue: str) -> str:
    """Record this attempt's start (the database's clock, labelled with its retry count,
    in a transaction of its own: a retrying attempt's session is rolled back), and ask
    for one retry ``countdown`` s later, sent to ``queue``."""
    _record_plain_effect(task.request.id, f"{label}:{task.request.retries}")
    if task.request.retries < 1:
        raise task.retry(countdown=countdown, queue=queue)
    return str(task.request.id)


@celery_app.task(name="e2e.plain_retry_on", bind=True, max_retries=3)
def plain_retry_on(self: Any, label: str, countdown: float, queue: str) -> str:
    """A plain task whose retry, ``countdown`` s later, is taken from ``queue``."""
    return _retry_on(self, label, countdown, queue)


@celery_app.task(name="e2e.retry_on", bind=True, base=IdempotentTask, max_retries=3)
def retry_on(self: IdempotentTask, label: str, countdown: float, queue: str) -> str:
    """The same on the idempotent base."""
    return _retry_on(self, label, countdown, queue)


def _retry_after_waiting(task: Any, label: str, wait: float, countdown: float) -> str:
    """Record this attempt's start (labelled with its retry count), and on the first
    attempt work ``wait`` s, then ask for one retry ``countdown`` s later."""
    _record_plain_effect(task.request.id, f"{label}:{task.request.retries}")
    if task.request.retries < 1:
        time.sleep(wait)
        raise task.retry(countdown=countdown)
    return str(task.request.id)


@celery_app.task(name="e2e.plain_retry_after", bind=True, max_retries=3)
def plain_retry_after(self: Any, label: str, wait: float, countdown: float) -> str:
    """A plain task that asks for its retry after working ``wait`` s."""
    return _retry_after_waiting(self, label, wait, countdown)


@celery_app.task(name="e2e.retry_after", bind=True, base=IdempotentTask, max_retries=3)
def retry_after(self: IdempotentTask, label: str, wait: float, countdown: float) -> str:
    """The same on the idempotent base."""
    return _retry_after_waiting(self, label, wait, countdown)


@celery_app.task(name="e2e.plain_retry_then_die", bind=True, max_retries=3)
def plain_retry_then_die(self: Any, label: str, countdown: float, queue: str) -> str:
    """A plain task that asks for one retry ``countdown`` s later, sent to ``queue``, and
    kills its worker before the attempt's outcome is recorded: only the worker that
    receives the retry can record when it is due."""
    _record_plain_effect(self.request.id, f"{label}:{self.request.retries}")
    if self.request.retries < 1:
        self.retry(countdown=countdown, queue=queue, throw=False)
        os.kill(os.getpid(), signal.SIGKILL)
    return str(self.request.id)


@celery_app.task(name="e2e.crash", bind=True, base=IdempotentTask)
def crash(self: IdempotentTask, label: str) -> None:
    """Kills the process that runs it, as a job that exhausts its memory would."""
    os.kill(os.getpid(), signal.SIGKILL)


@celery_app.task(name="e2e.plain_long", bind=True)
def plain_long(self: Any, label: str, seconds: float) -> str:
    """A plain task whose every start is recorded (``<label>:start``), then works
    ``seconds`` and records its end (``label``): a test counts the bodies started."""
    _record_plain_effect(self.request.id, f"{label}:start")
    time.sleep(seconds)
    return _record_plain_effect(self.request.id, label)


# -- a chain's next link that cannot be sent the first time -------------------------------

#: A label starting so makes the first publish of its task, as a chain's next link, kill
#: the process sending it (after the link before committed its completion)...
DIE_AT_DISPATCH = "die-at-dispatch:"
#: ... or fail, as a publish to a broker that went away does.
FAIL_AT_DISPATCH = "fail-at-dispatch:"


def _first_dispatch(label: str) -> bool:
    """True the first time ``label`` is being published (recorded as ``label:dispatch``)."""
    with psycopg.connect(os.environ["E2E_EFFECTS_DSN"], autocommit=True) as conn:
        mark = f"{label}:dispatch"
        inserted = conn.execute(
            "INSERT INTO e2e_effects (task_id, label) SELECT '-', %s"
            " WHERE NOT EXISTS (SELECT 1 FROM e2e_effects WHERE label = %s)",
            (mark, mark),
        ).rowcount
        return inserted == 1


def _label_of(body: Any) -> str:
    args = body[0] if isinstance(body, tuple | list) and body else ()
    return args[0] if args and isinstance(args[0], str) else ""


@worker_init.connect
@worker_process_init.connect
def _break_the_first_dispatch(**_: Any) -> None:
    """In a worker only: the first publish of a ``DIE_AT_DISPATCH`` label kills the
    process sending it; of a ``FAIL_AT_DISPATCH`` label, raises as kombu does when the
    broker is gone. Not a ``before_task_publish`` receiver: its errors are only logged,
    and a receiver in the test process would turn beat's message templates off."""
    amqp = celery_app.amqp
    send = amqp.send_task_message

    def sending(producer: Any, name: str, message: Any, **options: Any) -> Any:
        label = _label_of(message.body)
        if label.startswith((DIE_AT_DISPATCH, FAIL_AT_DISPATCH)) and _first_dispatch(label):
            if label.startswith(DIE_AT_DISPATCH):
                os.kill(os.getpid(), signal.SIGKILL)
            raise OperationalError(f"{label}: the broker went away (a test's publish)")
        return send(producer, name, message, **options)

    amqp.send_task_message = sending
