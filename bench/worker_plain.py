"""The baseline of ``python -m bench workers``: plain Celery, this package not
installed (nothing here imports ``beat``), with the settings the project's app gives
its workers (``app.settings``: JSON, late acks, one message prefetched per process,
task events) on the same broker and queue.

``python -m bench.worker_plain POOL PROCESSES`` runs its worker through Celery's
``Worker`` rather than the ``celery`` command, which loads every installed package's
``celery.commands`` plugins (this package's ``schedules`` among them). ``register``
defines the benchmark's plain tasks on any app (the tracked modes register them on
the project's app).
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

from celery import Celery

from bench import worker_probe  # noqa: F401  (counts this process's tasks)

NOOP = "bench.w.noop"
SLEEP = "bench.w.sleep"
HELD = "bench.w.held"
#: Seconds the sleeping task sleeps, and the held one (the heartbeats' pass).
SLEEP_SECONDS = 0.01
HELD_SECONDS = 60.0


def register(app: Celery) -> None:
    @app.task(name=NOOP)  # type: ignore[untyped-decorator]
    def noop(*args: Any, **kwargs: Any) -> None:
        return None

    @app.task(name=SLEEP)  # type: ignore[untyped-decorator]
    def sleep(*args: Any, **kwargs: Any) -> None:
        time.sleep(SLEEP_SECONDS)

    @app.task(name=HELD)  # type: ignore[untyped-decorator]
    def held(*args: Any, **kwargs: Any) -> None:
        time.sleep(HELD_SECONDS)


def plain_app(broker_url: str, prefix: str) -> Celery:
    """Plain Celery on ``broker_url``, its Redis keys under ``prefix``."""
    app = Celery("bench_plain", broker=broker_url)
    app.conf.update(
        broker_transport_options={"global_keyprefix": prefix} if prefix else {},
        broker_connection_retry_on_startup=True,
        task_serializer="json",
        result_serializer="json",
        accept_content=["json"],
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=1,
        worker_send_task_events=True,
        enable_utc=True,
    )
    register(app)
    return app


celery_app = plain_app(
    os.environ.get("CELERY_BROKER_URL", "redis://127.0.0.1:6379/13"),
    os.environ.get("HABEAT_BROKER_KEY_PREFIX", ""),
)


if __name__ == "__main__":
    pool, processes = sys.argv[1], int(sys.argv[2])
    worker = celery_app.Worker(
        pool_cls=pool,
        concurrency=processes,
        loglevel="WARNING",
        without_gossip=True,
        without_mingle=True,
        without_heartbeat=True,
    )
    worker.start()
    sys.exit(worker.exitcode)
