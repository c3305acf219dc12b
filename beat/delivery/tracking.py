"""What workers do with beat's runs, recorded from Celery's own signals.

Installed in a worker by importing this module (the app's ``imports`` setting
lists it); no task has to change. It covers what the idempotent base
(``beat.delivery.task.IdempotentTask``) cannot see from inside a task:

- the receipt of a run beat published: ``beat.delivery.receipts``, under the
  receipt leases the worker's heartbeat renews (``beat.delivery.heartbeat``);
- plain tasks' runs, started only while their delivery holds them and their
  outcomes recorded: ``beat.delivery.plain_runs`` (with the retries Celery could not
  publish: ``beat.delivery.unsent_retries``);
- expiry and retries' due times by the database's clock:
  ``beat.delivery.database_clock`` (reading the times a message carries:
  ``beat.delivery.message_times``).

Only runs beat published are recorded (their messages carry beat's headers);
other tasks are left to Celery.

This module connects their handlers to Celery's signals, on import, and keeps the
names workers and tests use from it.
"""

from __future__ import annotations

from celery.signals import (
    before_task_publish,
    task_postrun,
    task_received,
    task_retry,
    task_revoked,
    worker_init,
    worker_ready,
)

from beat.delivery.database_clock import (
    EXPIRY_MARGIN,
    WorkerClock,
    _add_consumer_step,
    _due_on_the_database_clock,
    _record_expiry,
    carry_database_instants,
    retime,
)
from beat.delivery.heartbeat import WorkerHeartbeat, _worker_ready
from beat.delivery.message_times import (
    DUE_HEADER,
    EXPIRES_HEADER,
    retry_delay,
    retry_due,
    run_expiry,
    seconds_until,
)
from beat.delivery.plain_runs import (
    REQUEUE_DELAY,
    _plain_run_cancelled,
    _plain_run_ended,
    recorded_error,
)
from beat.delivery.plain_runs import _plain_outcome as _plain_outcome
from beat.delivery.plain_runs import _running_plain as _running_plain
from beat.delivery.receipts import _hold_received_run
from beat.delivery.unsent_retries import _unsent_retries as _unsent_retries
from beat.delivery.unsent_retries import note_unsent_retries
from beat.delivery.workflow_steps import install_step_recording
from beat.publish.messages import RETRY_INSTANTS_RECEIVER

__all__ = [
    "DUE_HEADER",
    "EXPIRES_HEADER",
    "EXPIRY_MARGIN",
    "REQUEUE_DELAY",
    "WorkerClock",
    "WorkerHeartbeat",
    "carry_database_instants",
    "install",
    "note_unsent_retries",
    "recorded_error",
    "retime",
    "retry_delay",
    "retry_due",
    "run_expiry",
    "seconds_until",
]


def install() -> None:
    """Connect the handlers (done on import; weak references are not used, so once is enough)."""
    task_received.connect(_hold_received_run, weak=False, dispatch_uid="habeat.hold_received_run")
    task_postrun.connect(_plain_run_ended, weak=False, dispatch_uid="habeat.plain_run_ended")
    task_retry.connect(_plain_run_cancelled, weak=False, dispatch_uid="habeat.plain_run_cancelled")
    task_revoked.connect(_record_expiry, weak=False, dispatch_uid="habeat.record_expiry")
    worker_ready.connect(_worker_ready, weak=False, dispatch_uid="habeat.worker_ready")
    worker_init.connect(_add_consumer_step, weak=False, dispatch_uid="habeat.expiry_step")
    before_task_publish.connect(
        _due_on_the_database_clock, weak=False, dispatch_uid=RETRY_INSTANTS_RECEIVER
    )
    install_step_recording()


install()
