"""Demo jobs, scheduled from code so that a fresh cluster has something to run."""

from __future__ import annotations

import logging
import time

from app import celery_app
from beat import IdempotentTask, periodic

logger = logging.getLogger(__name__)


@periodic(every=10, name="demo-heartbeat")
@celery_app.task(name="tasks.demo.heartbeat", base=IdempotentTask)
def heartbeat() -> str:
    """Logs a line every 10 seconds: proof the cluster schedules and runs."""
    logger.info("heartbeat")
    return "ok"


@periodic(cron="*/1 * * * *", name="demo-report", kwargs={"size": 3})
@celery_app.task(name="tasks.demo.report", base=IdempotentTask)
def report(size: int = 3) -> dict[str, int]:
    """A once-a-minute job that takes a little while."""
    time.sleep(min(size, 10) * 0.1)
    return {"rows": size * 100}


@celery_app.task(name="tasks.demo.add", base=IdempotentTask)
def add(x: int, y: int) -> int:
    return x + y


@celery_app.task(name="tasks.demo.export", base=IdempotentTask)
def export(seconds: float = 5) -> str:
    """An export that takes ``seconds``: a job to watch with ``--max-runtime``."""
    time.sleep(seconds)
    return "exported"
