"""The tracked modes of ``python -m bench workers``: the project's app (run tracking
installed), the benchmark's plain tasks and the same tasks on the idempotent base
(``HABEAT_IMPORTS=bench.worker_tracked``)."""

from __future__ import annotations

import time
from typing import Any

from app import celery_app
from beat import IdempotentTask
from bench.worker_plain import HELD_SECONDS, SLEEP_SECONDS, register

GUARDED_NOOP = "bench.w.guarded_noop"
GUARDED_SLEEP = "bench.w.guarded_sleep"
GUARDED_HELD = "bench.w.guarded_held"

register(celery_app)


@celery_app.task(name=GUARDED_NOOP, base=IdempotentTask)  # type: ignore[untyped-decorator]
def guarded_noop(*args: Any, **kwargs: Any) -> None:
    return None


@celery_app.task(name=GUARDED_SLEEP, base=IdempotentTask)  # type: ignore[untyped-decorator]
def guarded_sleep(*args: Any, **kwargs: Any) -> None:
    time.sleep(SLEEP_SECONDS)


@celery_app.task(name=GUARDED_HELD, base=IdempotentTask)  # type: ignore[untyped-decorator]
def guarded_held(*args: Any, **kwargs: Any) -> None:
    time.sleep(HELD_SECONDS)
