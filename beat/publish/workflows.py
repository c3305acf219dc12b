"""Publishing a workflow run: its canvas, sent by Celery's own canvas code, each step
with the task ID derived from the run ID and its path (``beat.schedule.workflow``).

Celery sends the first steps (a chain's first element, a group's members, a chord's
header, setting up the chord's counter in the result backend); the workers send the
rest as the steps before them succeed, as Celery always does. Each step's message
carries beat's headers (so a worker records it as a run of beat's: receipt,
idempotency guard, outcome, reclaim) and its workflow run and path. Every step message,
whoever sends it, is recorded as a run of its own before it leaves
(``beat.delivery.workflow_steps``): a step whose message is lost is looked for and sent
again alone, as any run is.

A workflow run published twice (a flush that failed after some messages left, a leader
that died before marking it published) sends the same task IDs and group IDs again: a
step taken already is refused by the receipt or the guard, and a chord counts its
header's parts under one ID.
"""

from __future__ import annotations

import contextlib
import itertools
import threading
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import celery.canvas
from celery import signature

from beat.errors import InvalidSchedule
from beat.models import RunToPublish
from beat.publish.messages import ATTEMPT_HEADER, FIRE_AT_HEADER, SCHEDULE_HEADER
from beat.schedule.workflow import WORKFLOW_TASK, canvas_of, stamped

__all__ = ["WORKFLOW_TASK", "send_workflow"]


def sendable(app: Any, run_id: uuid.UUID, canvas: dict[str, Any], headers: dict[str, Any]) -> Any:
    """The Celery canvas of ``canvas`` for run ``run_id``, its IDs derived
    (``beat.schedule.workflow.stamped``), ready to ``apply_async`` under
    ``derived_ids(run_id)``."""
    return signature(stamped(canvas, run_id, headers), app=app)


@contextlib.contextmanager
def derived_ids(run_id: uuid.UUID) -> Iterator[None]:
    """In this thread, make the IDs Celery's canvas code draws while it sends (``uuid()``
    in ``celery.canvas``) derived from ``run_id``, in the order it draws them.

    Each step and group carries its derived ID already; what is left is an ID Celery
    makes itself and a send does not keep: a chord's header frozen as a new group (a
    chord inside a chain or a group is cloned, and its header rebuilt as a list, before
    it is frozen). Its parts are counted under that ID: sent twice with two random IDs,
    two copies of one header would each wait for parts the other ran. Drawn in the same
    order from the same canvas, the IDs are the same at every send: beat's of a workflow
    (``run_id``: the run's), a worker's of what follows a step (the step's run ID:
    ``beat.delivery.links``). Other threads draw Celery's own random IDs meanwhile."""
    drawn = itertools.count()
    outer = getattr(_drawing, "draw", None)
    _drawing.draw = lambda: str(uuid.uuid5(run_id, f"celery:{next(drawn)}"))
    celery.canvas.uuid = _canvas_uuid  # once for all: the same function every time
    try:
        yield
    finally:
        _drawing.draw = outer


def _canvas_uuid() -> str:
    """``celery.canvas.uuid`` once ``derived_ids`` was used: the thread's derived ID
    inside it, Celery's random one elsewhere."""
    draw: Callable[[], str] | None = getattr(_drawing, "draw", None)
    return draw() if draw is not None else str(_random_uuid())


#: The thread's drawing of derived IDs (``derived_ids``), if any.
_drawing = threading.local()
#: What ``celery.canvas`` draws IDs with (kombu's random UUIDs).
_random_uuid = celery.canvas.uuid


def send_workflow(app: Any, producer: Any, run: RunToPublish, *, mandatory: bool) -> None:
    """Send the first steps of workflow ``run`` through ``producer`` (inside its batch,
    where it has one)."""
    headers = {
        SCHEDULE_HEADER: run.schedule_name,
        FIRE_AT_HEADER: run.fire_at.isoformat() if run.fire_at else None,
        ATTEMPT_HEADER: 1,
    }
    try:
        canvas = sendable(app, run.id, canvas_of(run.kwargs), headers)
    except InvalidSchedule as exc:  # a row written with psql: the run's fault, not the broker's
        raise ValueError(str(exc)) from None
    options: dict[str, Any] = {"producer": producer, "retry": False}
    if mandatory:
        options["mandatory"] = True  # an unroutable step comes back (``beat.publish.returns``)
    try:
        with derived_ids(run.id):
            canvas.apply_async(**options)
    except NotImplementedError as exc:  # Celery's "a chord needs a result backend"
        raise ValueError(f"cannot send this workflow: {exc}") from None
