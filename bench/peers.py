"""The Celery app the peer schedulers run with (``celery -A bench.peers beat -S ...``):
Celery's own beat (PersistentScheduler) and celery-redbeat, configured from the
environment the benchmark sets, sending to the same Redis queue as ours.

    BENCH_REDIS_URL, BENCH_PREFIX  broker and key prefix of the run
    BENCH_SCHEDULES                number of schedules
    BENCH_EVERY                    seconds between runs; 0 (default): the cron below
    BENCH_CRON                     a cron of which minute and hour are used (default every minute)
    BENCH_LOCK_TIMEOUT             RedBeat's lock timeout, in seconds (default 25)
    BENCH_MAX_INTERVAL             beat_max_loop_interval (default 5, RedBeat's own default)
"""

from __future__ import annotations

import os
from datetime import timedelta
from typing import Any

from celery import Celery
from celery.schedules import crontab

from bench.common import TASK

_prefix = os.environ["BENCH_PREFIX"]
_redis_url = os.environ["BENCH_REDIS_URL"]
_every = float(os.environ.get("BENCH_EVERY", "0"))


def _schedule() -> Any:
    if _every:
        return timedelta(seconds=_every)
    minute, hour, *_ = os.environ.get("BENCH_CRON", "* * * * *").split()
    return crontab(minute=minute, hour=hour)


app = Celery("bench_peers", broker=_redis_url, set_as_current=True)
app.conf.update(
    broker_transport_options={"global_keyprefix": f"{_prefix}:broker:"},
    task_serializer="json",
    accept_content=["json"],
    timezone="UTC",
    enable_utc=True,
    beat_schedule={
        f"bench-{i:07d}": {"task": TASK, "schedule": _schedule(), "args": [i]}
        for i in range(int(os.environ["BENCH_SCHEDULES"]))
    },
    redbeat_redis_url=_redis_url,
    redbeat_key_prefix=f"{_prefix}:redbeat",
    # RedBeat renews its lock once a tick: its ticks must be shorter than the lock.
    beat_max_loop_interval=float(os.environ.get("BENCH_MAX_INTERVAL", "5")),
    redbeat_lock_timeout=int(os.environ.get("BENCH_LOCK_TIMEOUT", "25")),
)
