"""A run's links (its callbacks and the rest of its chain), sent at least once.

Celery sends a task's links after the task returns, in its tracer. On the idempotent
base the run is recorded ``succeeded`` before that (a completion refused because the
lease was lost must send nothing), so a worker that dies, or a broker that refuses
the send, in between would lose them: the message comes back, and its second delivery
is a duplicate of a succeeded run. So the base sends the links itself, right after
the completion that kept what they are sent with (``beat.store.run_links``), and a
second delivery that finds them unsent sends them.

What a send again may cost: the links keep their task IDs (a chain's are set when it
is sent; a callback without one gets one derived from the run ID here, the same at
every send), so a link on the idempotent base runs once however often it is sent. A
plain link sent again after a send that reached the broker and still raised runs as
Celery runs a message sent twice: that is an ad hoc plain task's semantics.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
import uuid
from typing import Any

from celery import Celery, group, signature, states
from celery.backends.base import DisabledBackend
from celery.exceptions import Reject
from kombu.exceptions import OperationalError

from beat.delivery.plain_runs import REQUEUE_DELAY
from beat.errors import StoreUnavailable
from beat.publish.workflows import derived_ids
from beat.store.run_links import RunLinks
from beat.store.runs import run_id_for

logger = logging.getLogger(__name__)

#: Namespace of the task IDs given to callbacks that had none (``link=`` signatures).
_CALLBACK_IDS = uuid.UUID("6f1d3a52-5b8e-4c1e-9a57-0b5c1d2e7a41")


def has_links(request: Any) -> bool:
    """Whether the delivery has callbacks or a chain to send once it succeeds, or a chord
    to be counted in (a chord's header part): what its completion keeps the result for,
    so that a second delivery does what a first that died left undone."""
    return bool(
        getattr(request, "callbacks", None)
        or getattr(request, "chain", None)
        or getattr(request, "chord", None)
    )


def links_record(result: Any) -> dict[str, Any] | None:
    """What the completion keeps for the links (``{"result": ...}``); None if the result
    cannot be kept in a JSONB column (not JSON, or JSON PostgreSQL refuses: NaN,
    infinities, a NUL character): the links are then left to Celery's tracer, as before.
    The completion must never fail on what the body returned."""
    record = {"result": result}
    try:
        encoded = json.dumps(record, allow_nan=False)
    except (TypeError, ValueError):
        return None
    return None if "\\u0000" in encoded else record


def send_links_after_completion(app: Celery, request: Any, store: RunLinks, result: Any) -> None:
    """Send the run's links right after its completion kept them; if the broker cannot
    take them, hand the message back (``Reject``): its next delivery sends them. A link
    that can never be sent (its signature does not fit its task) fails the task as
    Celery's tracer would, and nothing tries it again."""
    run_id = run_id_for(request.id)
    try:
        send_links(app, request, result)
        # Counted before the links are marked sent: a worker that dies after the
        # completion and before Celery's tracer counts it leaves it to the next delivery
        # (a chord counts a part once by its task ID), and so does a backend that
        # cannot take it now (the leader sends the message again: ``links_left_unsent``).
        counted = not getattr(request, "chord", None) or _record_success(app, request, result)
    except Exception as exc:
        forget_links(request)
        if not _broker_unavailable(app, exc):
            _give_up(store, run_id, exc)
            raise
        logger.warning(
            "run %s succeeded, but its links could not be sent (%s): handing its message"
            " back, so that a later delivery sends them",
            run_id,
            exc,
            extra={"run_id": str(run_id)},
        )
        raise Reject(str(exc), requeue=True) from exc
    forget_links(request)
    if not counted:
        return  # its links went; its count in the chord is left to a later delivery
    try:
        store.links_sent(run_id)
    except StoreUnavailable as exc:
        # Sent again only if the message comes back, under the same task IDs.
        logger.warning("run %s: its links were sent, not recorded so: %s", run_id, exc)


def send_links_left_unsent(
    app: Celery, request: Any, store: RunLinks, run_id: uuid.UUID, *, settle_seconds: float
) -> None:
    """A second delivery of a succeeded run sends the links its first delivery left
    unsent (its worker died, or the broker refused them), once ``settle_seconds`` (the
    lease) have passed since the completion; before, the message goes back to wait."""
    try:
        unsent = store.unsent_links(run_id, settle_seconds=settle_seconds)
        if unsent is None:
            return
        if not unsent.settled:
            raise Reject("its first delivery may still send its links", requeue=True)
        try:
            send_links(app, request, unsent.result)
        except Exception as exc:
            if _broker_unavailable(app, exc):
                raise
            forget_links(request)
            _give_up(store, run_id, exc)
            raise
        forget_links(request)
        counted = _record_success(app, request, unsent.result)
        if counted or not getattr(request, "chord", None):  # else a later delivery counts it
            store.links_sent(run_id)
    except Reject:
        forget_links(request)
        time.sleep(REQUEUE_DELAY)  # do not spin on the message
        raise
    except Exception as exc:
        # Only a failure builds the broker's errors (a connection object): most second
        # deliveries have nothing left unsent.
        if not (isinstance(exc, StoreUnavailable) or _broker_unavailable(app, exc)):
            raise
        forget_links(request)
        logger.warning(
            "could not send the links run %s left unsent, handing its message back: %s",
            run_id,
            exc,
            extra={"run_id": str(run_id)},
        )
        time.sleep(REQUEUE_DELAY)
        raise Reject(str(exc), requeue=True) from exc
    logger.warning(
        "sent the links of run %s, which its first delivery left unsent",
        run_id,
        extra={"run_id": str(run_id)},
    )


def _broker_errors(app: Celery) -> tuple[type[BaseException], ...]:
    """What a send raises when the broker cannot take it now (not: a link that can never
    be sent, an encoding error)."""
    connection = app.connection_for_write()
    try:
        return (
            OperationalError,
            ConnectionError,
            TimeoutError,
            *connection.connection_errors,
            *connection.recoverable_connection_errors,
        )
    finally:
        connection.release()


def _broker_unavailable(app: Celery, exc: BaseException) -> bool:
    return isinstance(exc, _broker_errors(app))


def _give_up(store: RunLinks, run_id: uuid.UUID, exc: BaseException) -> None:
    """A link that can never be sent: said, and not kept for a later delivery."""
    logger.error(
        "the links of run %s cannot be sent (%s): the task fails as Celery fails it",
        run_id,
        exc,
        extra={"run_id": str(run_id)},
    )
    with contextlib.suppress(StoreUnavailable):
        store.links_sent(run_id)


def _record_success(app: Celery, request: Any, result: Any) -> bool:
    """Store the result the first delivery did not (it handed its message back before
    Celery's tracer stored it), so a result backend, and a chord the run belongs to,
    learn it succeeded; once: not if the backend has it already. False if the backend
    could not take it."""
    backend = app.backend
    if isinstance(backend, DisabledBackend) or getattr(request, "ignore_result", False):
        return True
    try:
        if backend.get_state(request.id) != states.SUCCESS:
            backend.mark_as_done(request.id, result, request)  # counted in its chord too
        elif getattr(request, "chord", None):
            # Stored, maybe not counted (its worker died in between): a chord counts
            # a part once by its task ID, so counting it again is safe.
            backend.on_chord_part_return(request, states.SUCCESS, result)
    except Exception as exc:  # the links are sent: a backend error must not undo that
        logger.warning(
            "could not store the result of %s in the result backend: %s", request.id, exc
        )
        return False
    return True


def send_links(app: Celery, request: Any, result: Any) -> None:
    """Send the request's callbacks with ``result``, then the rest of its chain, as
    Celery's tracer does, each callback with a stable task ID; raises what kombu raises."""
    with derived_ids(run_id_for(request.id)):  # the same IDs if sent again
        _send_links(app, request, result)


def _send_links(app: Celery, request: Any, result: Any) -> None:
    parent_id = request.id
    options = {
        "parent_id": parent_id,
        "root_id": request.root_id or parent_id,
        "priority": _inherited_priority(app, request),
    }
    callbacks = [signature(callback, app=app) for callback in request.callbacks or ()]
    for index, callback in enumerate(callbacks):
        members = callback.tasks if isinstance(callback, group) else [callback]
        for number, member in enumerate(members):
            if not member.options.get("task_id"):
                stable = uuid.uuid5(_CALLBACK_IDS, f"{parent_id}:{index}:{number}")
                member.set(task_id=str(stable))
    if len(callbacks) == 1:
        callbacks[0].apply_async((result,), **options)
    elif callbacks:
        groups = [callback for callback in callbacks if isinstance(callback, group)]
        others = [callback for callback in callbacks if not isinstance(callback, group)]
        for group_ in groups:
            group_.apply_async((result,), **options)
        if others:
            group(others, app=app).apply_async((result,), **options)
    chain = request.chain
    if chain:
        signature(chain[-1], app=app).apply_async((result,), chain=chain[:-1], **options)


def forget_links(request: Any) -> None:
    """Leave nothing for Celery's tracer to send: the base sent the links itself."""
    request.callbacks = None
    request.chain = None


def _inherited_priority(app: Celery, request: Any) -> int | None:
    if not app.conf.task_inherit_parent_priority:
        return None
    priority: int | None = (request.delivery_info or {}).get("priority")
    return priority
