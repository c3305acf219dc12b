"""The job of the reclaim benchmark: works for a while, checking its lease, so that
a worker can be killed in the middle of it (``HABEAT_IMPORTS=bench.jobs``)."""

from __future__ import annotations

import time

from app import celery_app
from beat import IdempotentTask


@celery_app.task(name="bench.slow", bind=True, base=IdempotentTask)  # type: ignore[untyped-decorator]
def slow(self: IdempotentTask, seconds: float) -> float:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        self.check_lease()
        time.sleep(0.1)
    return seconds
