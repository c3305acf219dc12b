"""What a benchmark worker process reports about itself, without this package.

Imported by the tasks of ``python -m bench workers`` in every worker process (plain
Celery too: nothing here imports ``beat``). Each process counts the benchmark tasks
it started and ended, when its first started and its last ended, how late each
started after the instant it was due, and the SQL statements its own engines sent
(SQLAlchemy's ``before_cursor_execute``, 0 where no engine is used). A thread writes
the counts to one Redis hash field per process every ``FLUSH_EVERY`` seconds, so a
task pays nothing for being measured beyond a few attribute updates.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from datetime import datetime
from typing import Any

import redis
from celery.signals import task_postrun, task_prerun, worker_process_init
from sqlalchemy import event
from sqlalchemy.engine import Engine

#: The Redis hash the counts go to (one field per process ID); unset: nothing reported.
KEY = os.environ.get("BENCH_PROBE_KEY", "")
REDIS_URL = os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/13")
#: The benchmark's tasks: other tasks are not counted.
TASK_PREFIX = "bench.w."
FLUSH_EVERY = 0.1


class _Counts:
    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.started = 0
        self.ended = 0
        self.first_start: float | None = None
        self.last_end: float | None = None
        self.statements = 0
        #: Seconds from the instant each task was due (its fire time, or the ``due``
        #: its sender gave) to its start.
        self.due_to_start: list[float] = []
        self._thread: threading.Thread | None = None

    def document(self) -> dict[str, Any]:
        return {
            "started": self.started,
            "ended": self.ended,
            "first_start": self.first_start,
            "last_end": self.last_end,
            "statements": self.statements,
            "due_to_start": self.due_to_start,
            # Proof that a baseline worker ran without this package.
            "beat_imported": "beat" in sys.modules,
        }

    def start_flushing(self) -> None:
        if KEY and self._thread is None:
            self._thread = threading.Thread(target=self._flush_loop, daemon=True)
            self._thread.start()

    def _flush_loop(self) -> None:
        client = redis.Redis.from_url(REDIS_URL)
        while True:
            client.hset(KEY, str(os.getpid()), json.dumps(self.document()))
            time.sleep(FLUSH_EVERY)


counts = _Counts()


def _due(task: Any, kwargs: dict[str, Any] | None) -> float | None:
    if kwargs and "due" in kwargs:
        return float(kwargs["due"])
    fire_at = getattr(task.request, "habeat_fire_at", None)
    return datetime.fromisoformat(fire_at).timestamp() if fire_at else None


def _started(task: Any = None, kwargs: dict[str, Any] | None = None, **_: Any) -> None:
    if task is None or not task.name.startswith(TASK_PREFIX):
        return
    now = time.time()
    counts.started += 1
    if counts.first_start is None:
        counts.first_start = now
    due = _due(task, kwargs)
    if due is not None:
        counts.due_to_start.append(now - due)


def _ended(task: Any = None, **_: Any) -> None:
    if task is None or not task.name.startswith(TASK_PREFIX):
        return
    counts.ended += 1
    counts.last_end = time.time()


def _statement(*_: Any) -> None:
    counts.statements += 1


def _forked(**_: Any) -> None:
    """A prefork pool process: its own counts, and its own thread (threads do not fork)."""
    counts.reset()
    counts.start_flushing()


task_prerun.connect(_started, weak=False, dispatch_uid="bench.probe.started")
task_postrun.connect(_ended, weak=False, dispatch_uid="bench.probe.ended")
worker_process_init.connect(_forked, weak=False, dispatch_uid="bench.probe.forked")
event.listen(Engine, "before_cursor_execute", _statement)
counts.start_flushing()
