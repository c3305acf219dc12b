"""Publishing claimed runs to the Celery broker, with the run ID as the task ID.

Beat publishes by task name (``send_task``): it needs no job code. It never
publishes with an ETA or countdown (a delay longer than the broker's
visibility timeout would run the task twice).

Runs go out in chunks through kombu's producer batches (``Producer.batch``):
on Redis a chunk is one pipelined round trip instead of one per message, which
is what bounds a leader's publish rate. A chunk whose flush fails has an
uncertain outcome (some of its messages may be in the queue): its runs stay in
the outbox and are published again, and the worker's guard refuses a second
delivery of a run.

Runs claimed ahead of their fire time are built into a batch before it and
sent at it (``publish_at``): their lateness is one Redis round trip. Nothing of
them reaches the broker before that time, whatever the routing or transport.
"""

from __future__ import annotations

import logging
import sys
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from beat.errors import HABeatError
from beat.models import RunToPublish

logger = logging.getLogger(__name__)

#: Message headers that tell a worker (and Flower) which schedule and fire time a run is for.
SCHEDULE_HEADER = "habeat_schedule"
FIRE_AT_HEADER = "habeat_fire_at"
ATTEMPT_HEADER = "habeat_attempt"

#: Messages per producer batch: one Redis pipeline each. Large enough that the
#: round trip is amortised, small enough that a failed flush leaves few runs to
#: publish again.
CHUNK = 500

#: Size of the producer batch of ``publish_at``: never reached. kombu flushes a batch
#: by itself once it holds ``max_size`` Redis commands, and one message takes an
#: LPUSH per queue its exchange routes it to (plus a PEXPIRE per priority step of a
#: queue with an expiry): no size derived from the number of messages fits every
#: routing, and an early flush would send runs before their fire time.
NEVER_FLUSH = sys.maxsize

#: ``argsrepr``/``kwargsrepr`` (shown by Flower and in worker logs) are cut to this.
REPR_LIMIT = 1024

#: Routing options of a run: a queue is declared once per batch for each distinct set.
ROUTING_OPTIONS = ("queue", "exchange", "routing_key", "exchange_type")


@dataclass(frozen=True, kw_only=True, slots=True)
class PublishResult:
    published: list[uuid.UUID]
    #: The error that stopped publishing, if any; the unpublished runs stay in the outbox.
    error: Exception | None = None


def publish_runs(app: Any, runs: Sequence[RunToPublish]) -> PublishResult:
    """Publish ``runs`` in order, a chunk per producer batch; stop at the first broker error.

    ``published`` lists the runs of the chunks whose flush succeeded.
    """
    published: list[uuid.UUID] = []
    if not runs:
        return PublishResult(published=published)
    try:
        with app.producer_or_acquire() as producer:
            declared: set[tuple[Any, ...]] = set()
            for chunk in _chunks(runs, CHUNK):
                with producer.batch(max_size=len(chunk) + 1):
                    for run in chunk:
                        _send(app, producer, run, declared)
                published.extend(run.id for run in chunk)
    except Exception as exc:  # the broker's errors are many and transport-specific
        logger.error(
            "publishing stopped after %d of %d runs: %s; the rest stay in the outbox",
            len(published),
            len(runs),
            exc,
            extra={"published": len(published), "due": len(runs)},
        )
        return PublishResult(published=published, error=exc)
    return PublishResult(published=published)


def publish_at(
    app: Any,
    runs: Sequence[RunToPublish],
    deadline: float,
    *,
    before_send: Callable[[], None] | None = None,
) -> PublishResult:
    """Build the messages of ``runs`` now and send them together at ``deadline``
    (``time.monotonic()``): at the fire time, only one round trip is left to do.

    Nothing is handed to the broker before ``deadline``: the messages wait in a kombu
    producer batch that never flushes by itself (``NEVER_FLUSH``), and on a transport
    that cannot batch (kombu would send each message as it is built) they are built
    at the deadline instead. ``before_send`` is called at the deadline, just before
    the send: a ``HABeatError`` from it (e.g. this process no longer leads) discards
    the messages and propagates. Runs are reported published all or none (a failed
    send may have delivered some: they are sent again, and the worker's guard runs
    each once).
    """
    if not runs:
        return PublishResult(published=[])
    try:
        with app.producer_or_acquire() as producer:
            build_ahead = producer.supports_batch_publish
            with producer.batch(max_size=NEVER_FLUSH):
                if build_ahead:
                    _send_all(app, producer, runs)
                time.sleep(max(0.0, deadline - time.monotonic()))
                if before_send is not None:
                    before_send()
                if not build_ahead:
                    _send_all(app, producer, runs)
    except HABeatError:
        raise  # from before_send: not the broker's error, nothing was sent
    except Exception as exc:  # the broker's errors are many and transport-specific
        logger.error(
            "publishing %d runs at their fire time failed: %s",
            len(runs),
            exc,
            extra={"published": 0, "due": len(runs)},
        )
        return PublishResult(published=[], error=exc)
    return PublishResult(published=[run.id for run in runs])


def _send_all(app: Any, producer: Any, runs: Sequence[RunToPublish]) -> None:
    declared: set[tuple[Any, ...]] = set()
    for run in runs:
        _send(app, producer, run, declared)


def _send(app: Any, producer: Any, run: RunToPublish, declared: set[tuple[Any, ...]]) -> None:
    options = publish_options(run)
    # kombu would re-check the queue declaration on every message; once a batch is enough.
    routing = tuple(repr(options.get(key)) for key in ROUTING_OPTIONS)
    if routing in declared:
        options["declare"] = []
    declared.add(routing)
    app.send_task(
        run.task,
        args=run.args,
        kwargs=run.kwargs,
        task_id=str(run.id),
        producer=producer,
        # Inside a batch nothing is sent until the flush: a publish retry has nothing to
        # retry, and a failed flush leaves the runs in the outbox.
        retry=False,
        **options,
    )


def publish_options(run: RunToPublish) -> dict[str, Any]:
    """``send_task`` options of a run: its schedule's options plus our headers."""
    options = dict(run.options)
    headers = dict(options.pop("headers", None) or {})
    headers[SCHEDULE_HEADER] = run.schedule_name
    headers[FIRE_AT_HEADER] = run.fire_at.isoformat() if run.fire_at else None
    headers[ATTEMPT_HEADER] = run.attempt + 1  # the attempt this delivery starts
    options["headers"] = headers
    options.setdefault("argsrepr", _short_repr(run.args))
    options.setdefault("kwargsrepr", _short_repr(run.kwargs))
    return options


def _short_repr(value: Any) -> str:
    """A stand-in for Celery's ``saferepr`` of JSON arguments, some 20 times cheaper."""
    text = repr(value)
    return text if len(text) <= REPR_LIMIT else text[: REPR_LIMIT - 3] + "..."


def _chunks(runs: Sequence[RunToPublish], size: int) -> Iterator[Sequence[RunToPublish]]:
    for start in range(0, len(runs), size):
        yield runs[start : start + size]
