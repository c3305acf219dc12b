"""The Celery app of the mixed fleet's worker without this package:
``celery -A tests.chaos.foreign_worker worker -Q plain``, started with
``tests/chaos/foreign`` first on ``PYTHONPATH`` (``import beat`` fails there).

It is configured as an existing project would configure a worker for the same
broker (JSON, late acks, one message prefetched per process), and knows only the
plain tasks (``tests.chaos.plain_jobs``), under the names beat publishes: it
consumes only the plain queue, since an idempotent task needs the package.
"""

from __future__ import annotations

import importlib
import os
from urllib.parse import parse_qs, urlsplit

from celery import Celery

from tests.chaos.plain_jobs import register


def _package_absent() -> bool:
    try:
        importlib.import_module("beat")
    except ImportError:
        return True
    return False


if not _package_absent():  # the harness started it in the wrong environment
    raise SystemExit("the worker without the package can import beat: fix its PYTHONPATH")


def _transport_options() -> dict[str, object]:
    options: dict[str, object] = {"unacked_restore_interval": 10, "unacked_restore_throttle": 1}
    prefix = os.environ.get("HABEAT_BROKER_KEY_PREFIX", "")
    if prefix:
        options["global_keyprefix"] = prefix
    # kombu's Sentinel transport takes the primary's name from its options, not the URL.
    master_name = parse_qs(urlsplit(os.environ["CELERY_BROKER_URL"]).query).get("master_name")
    if master_name:
        options["master_name"] = master_name[0]
    return options


app = Celery("foreign")
app.conf.update(
    broker_url=os.environ["CELERY_BROKER_URL"],
    broker_transport_options=_transport_options(),
    broker_connection_retry_on_startup=True,
    task_serializer="json",
    accept_content=["json"],
    task_acks_late=True,
    task_reject_on_worker_lost=True,
    worker_prefetch_multiplier=1,
    # As docs/reference/configuration.md asks of a threads worker on RabbitMQ: Celery 5.7
    # can deadlock its consumer restoring the prefetch count after a reconnect.
    worker_enable_prefetch_count_reduction=False,
    timezone="UTC",
    enable_utc=True,
)
register(app)
