"""Publishing claimed runs to the Celery broker, with the run ID as the task ID.

Beat publishes by task name (``send_task``): it needs no job code. It never
publishes with an ETA or countdown (a delay longer than the broker's
visibility timeout would run the task twice).
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from beat.models import RunToPublish

logger = logging.getLogger(__name__)

#: Message headers that tell a worker (and Flower) which schedule and fire time a run is for.
SCHEDULE_HEADER = "habeat_schedule"
FIRE_AT_HEADER = "habeat_fire_at"
ATTEMPT_HEADER = "habeat_attempt"

#: One quick retry rides over a stale pooled broker connection; a broker that is
#: really down fails fast, and the outbox publishes the runs on a later tick.
RETRY_POLICY = {"max_retries": 1, "interval_start": 0.2, "interval_step": 0.2, "interval_max": 0.5}


@dataclass(frozen=True, kw_only=True, slots=True)
class PublishResult:
    published: list[uuid.UUID]
    #: The error that stopped the batch, if any; the unpublished runs stay in the outbox.
    error: Exception | None = None


def publish_runs(app: Any, runs: Sequence[RunToPublish]) -> PublishResult:
    """Publish ``runs`` in order over one producer; stop at the first broker error."""
    published: list[uuid.UUID] = []
    if not runs:
        return PublishResult(published=published)
    try:
        with app.producer_or_acquire() as producer:
            for run in runs:
                app.send_task(
                    run.task,
                    args=run.args,
                    kwargs=run.kwargs,
                    task_id=str(run.id),
                    producer=producer,
                    retry=True,
                    retry_policy=RETRY_POLICY,
                    **publish_options(run),
                )
                published.append(run.id)
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


def publish_options(run: RunToPublish) -> dict[str, Any]:
    """``send_task`` options of a run: its schedule's options plus our headers."""
    options = dict(run.options)
    headers = dict(options.pop("headers", None) or {})
    headers[SCHEDULE_HEADER] = run.schedule_name
    headers[FIRE_AT_HEADER] = run.fire_at.isoformat() if run.fire_at else None
    headers[ATTEMPT_HEADER] = run.attempt + 1  # the attempt this delivery starts
    options["headers"] = headers
    return options
