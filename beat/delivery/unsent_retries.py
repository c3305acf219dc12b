"""Retries Celery could not publish (the broker being down): their due times are
kept, so that the run is recorded ``retrying`` and the leader sends the retry once
it is due, instead of ending ``failed``."""

from __future__ import annotations

import inspect
import logging
import time
from typing import Any

from celery import Task as CeleryTask
from celery import current_app
from celery.exceptions import Reject

from beat.delivery.message_times import seconds_until

logger = logging.getLogger(__name__)

#: Task ID → when the retry it asked for is due (``time.monotonic()``), for a retry
#: Celery could not publish (``_note_unsent_retries``).
_unsent_retries: dict[str, float] = {}


def _note_unsent_retries(name: str) -> None:
    """Note the retries of the task ``name`` that Celery cannot publish
    (``note_unsent_retries``); never in the way of the run, which has started."""
    try:
        note_unsent_retries(current_app.tasks.get(name))
    except Exception as exc:
        logger.warning("cannot note the unsent retries of %s: %s", name, exc)


def note_unsent_retries(task: Any) -> None:
    """Note the retries of ``task`` that Celery cannot publish.

    ``Task.retry`` raises ``Reject`` (not requeued) when it cannot publish the retry,
    the broker being down: the retry was asked for and never sent, and Celery records
    neither it nor its countdown. Wrapped on the task instance (once, at its first run
    of beat's), ``retry`` keeps the due time of such a retry, so that the run is
    recorded ``retrying`` (``_plain_outcome``) and the leader sends its message again
    once it is due, instead of ending ``failed``: a retry lost to a broker outage.

    Only a retry the leader can send as Celery would have is kept: one of Celery's own
    ``Task.retry`` (an override may compute its countdown out of sight) that asks for
    no other arguments or options than the run's (the leader sends the run's own);
    any other ends ``failed``, as before."""
    if task is None or getattr(task.retry, "habeat_notes_unsent", False):
        return
    if getattr(type(task), "retry", None) is not CeleryTask.retry:
        return
    ask = task.retry

    def retry(*args: Any, **kwargs: Any) -> Any:
        # Read before the publish, which may take a while to fail.
        due = _unsent_retry_due(task, _RETRY_PARAMETERS.bind_partial(task, *args, **kwargs))
        try:
            return ask(*args, **kwargs)
        except Reject:  # only its publish raises this: the retry was not sent
            if due is not None:
                _unsent_retries[task.request.id] = due
            raise

    retry.habeat_notes_unsent = True  # type: ignore[attr-defined]
    task.retry = retry


_RETRY_PARAMETERS = inspect.signature(CeleryTask.retry)


def _unsent_retry_due(task: Any, asked: inspect.BoundArguments) -> float | None:
    """When a retry asked with ``asked`` is due (``time.monotonic()``), as Celery
    reads its countdown and ETA; None if it asks for other arguments or options than
    the run's, which the leader could not send."""
    given = asked.arguments
    if given.get("args") is not None or given.get("kwargs") is not None or given.get("options"):
        return None
    countdown, eta = given.get("countdown"), given.get("eta")
    if not eta and countdown is None:
        countdown = task.default_retry_delay
    # Celery's message takes its ETA from a countdown if there is one (amqp.as_task_v2).
    return time.monotonic() + seconds_until(countdown if countdown else (eta or 0))
