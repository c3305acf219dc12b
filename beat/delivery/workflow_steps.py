"""Each step of a workflow run recorded as a run of its own, before its message leaves.

A workflow's first steps are sent by beat, the others by the workers, as Celery sends
a chain's next element or a chord's body once what comes before it succeeded. Whoever
sends a step's message (its headers name the workflow run and the step's path:
``beat.schedule.workflow``), ``before_task_publish`` records the step's run first,
with what publishing it again takes (its task, arguments, and its place in the canvas:
chain, chord, group, callbacks): from then on the leader looks for that message and
sends it again if it is lost, and the reaper reclaims the step if its worker dies, as
for any run beat published. A step is recorded once: a message sent again finds its
run made.

That write may fail (PostgreSQL unreachable at that moment): Celery logs what a
``before_task_publish`` receiver raises and sends the message anyway, and the worker
that receives it records the step then (``record_received_step``), before its receipt.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Mapping
from typing import Any

from celery import current_app
from celery.signals import before_task_publish

from beat.config import uses_this_scheduler
from beat.delivery.app_config import delivery_config
from beat.delivery.message_times import seconds_until
from beat.publish.messages import STEP_RECORDER
from beat.schedule.workflow import STEP_HEADER, WORKFLOW_HEADER
from beat.store.runs import run_store_for
from beat.store.workflow_steps import StepMessage, step_options

logger = logging.getLogger(__name__)

#: What a step's message carries in its headers, as ``send_task`` options.
_HEADER_OPTIONS = {
    "group": "group_id",
    "group_index": "group_index",
    "root_id": "root_id",
    "parent_id": "parent_id",
}
#: What it carries in the body's embed, as ``send_task`` options.
_EMBED_OPTIONS = {
    "callbacks": "link",
    "errbacks": "link_error",
    "chain": "chain",
    "chord": "chord",
}


#: Headers of Celery's task protocol (version 2), not a step's own.
_CELERY_HEADERS = frozenset(
    {
        "lang",
        "task",
        "id",
        "shadow",
        "eta",
        "expires",
        "group",
        "group_index",
        "retries",
        "timelimit",
        "root_id",
        "parent_id",
        "argsrepr",
        "kwargsrepr",
        "origin",
        "ignore_result",
        "replaced_task_nesting",
        "stamped_headers",
        "stamps",
        # what a worker's request adds to them
        "callbacks",
        "errbacks",
        "chain",
        "chord",
        "reply_to",
        "correlation_id",
        "hostname",
        "delivery_info",
        "properties",
        "is_eager",
        "args",
        "kwargs",
    }
)
_STEP_HEADERS = frozenset({WORKFLOW_HEADER, STEP_HEADER})


def install_step_recording() -> None:
    """Record the steps this process sends (a worker's, and beat's: its first steps)."""
    before_task_publish.connect(record_sent_step, weak=False, dispatch_uid=STEP_RECORDER)


def is_step(headers: Mapping[str, Any]) -> bool:
    return bool(headers.get(WORKFLOW_HEADER)) and headers.get(STEP_HEADER) is not None


def record_sent_step(
    body: Any = None,
    routing_key: str | None = None,
    headers: dict[str, Any] | None = None,
    properties: Mapping[str, Any] | None = None,
    **_: Any,
) -> None:
    """``before_task_publish``: record a step's run before its message leaves (any
    process: beat, a pool process, a worker's main process)."""
    if not isinstance(headers, dict) or not is_step(headers):
        return
    app = current_app._get_current_object()
    if not uses_this_scheduler(app.conf):
        return
    args, kwargs, embed = (
        body if isinstance(body, tuple | list) and len(body) == 3 else ([], {}, {})
    )
    message = step_message(
        headers,
        task=str(headers.get("task")),
        args=list(args),
        kwargs=dict(kwargs),
        embed=embed or {},
        queue=routing_key,
        priority=(properties or {}).get("priority"),
    )
    try:
        run_store_for(delivery_config(app.conf).database_url).record_step(message)
    except Exception as exc:  # the receiving worker records it (``record_received_step``)
        logger.warning(
            "could not record step %s of workflow run %s as sent: %s",
            message.step,
            message.workflow_run_id,
            exc,
        )


def record_received_step(store: Any, request: Any, context: Mapping[str, Any]) -> None:
    """Record the step a worker received (its main process: Celery's request), unless
    it was recorded when sent."""
    delivery = getattr(request, "delivery_info", None) or {}
    store.record_step(
        step_message(
            context,
            task=request.name,
            args=list(request.args or ()),
            kwargs=dict(request.kwargs or {}),
            embed=context,
            queue=delivery.get("routing_key"),
            priority=delivery.get("priority"),
        )
    )


def record_started_step(store: Any, task: str, context: Mapping[str, Any]) -> bool:
    """Record the step about to start (a pool process: the task's request), whose row
    neither its send nor its receipt made (PostgreSQL was unreachable then, or the
    worker that sent it had no recording); True if this made it."""
    delivery = context.get("delivery_info") or {}
    return bool(
        store.record_step(
            step_message(
                context,
                task=task,
                args=list(context.get("args") or ()),
                kwargs=dict(context.get("kwargs") or {}),
                embed=context,
                queue=delivery.get("routing_key"),
                priority=delivery.get("priority"),
            )
        )
    )


def step_message(
    headers: Mapping[str, Any],
    *,
    task: str,
    args: list[Any],
    kwargs: dict[str, Any],
    embed: Mapping[str, Any],
    queue: str | None,
    priority: int | None,
) -> StepMessage:
    """A step's run as its message shows it: the ``send_task`` options that send it again
    as it was sent (its chain, chord, group and callbacks; its queue, limits, expiry and
    own headers), and when it is due if it has an ETA (a countdown)."""
    options = {option: headers.get(key) for key, option in _HEADER_OPTIONS.items()}
    options |= {option: embed.get(key) for key, option in _EMBED_OPTIONS.items()}
    soft, hard = _time_limits(headers.get("timelimit"))
    options |= {
        "soft_time_limit": soft,
        "time_limit": hard,
        "expires": headers.get("expires"),
        "shadow": headers.get("shadow"),
        "ignore_result": headers.get("ignore_result") or None,
    }
    # The step's own headers go with it when it is sent again; beat sets its own anew.
    options["headers"] = {
        key: value
        for key, value in headers.items()
        if key not in _CELERY_HEADERS and (not key.startswith("habeat_") or key in _STEP_HEADERS)
    }
    if queue:
        options["queue"] = queue
    if priority is not None:
        options["priority"] = priority
    eta = headers.get("eta")
    return StepMessage(
        task_id=str(headers["id"]),
        workflow_run_id=uuid.UUID(str(headers[WORKFLOW_HEADER])),
        step=str(headers[STEP_HEADER]),
        task=task,
        args=args,
        kwargs=kwargs,
        options=step_options(options),
        # Measured on this host's clock from now, as Celery computed the ETA from it.
        due_in=None if not eta else max(0.0, seconds_until(eta)),
    )


def _time_limits(given: Any) -> tuple[float | None, float | None]:
    """Celery's ``timelimit`` header, ``[hard, soft]``, as ``(soft, hard)``."""
    if isinstance(given, list | tuple) and len(given) == 2:
        return given[1], given[0]
    return None, None
