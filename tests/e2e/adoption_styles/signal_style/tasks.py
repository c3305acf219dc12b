import os
from typing import Any

from celery.schedules import crontab
from signal_style.celery_app import app


@app.on_after_finalize.connect
def setup_periodic_tasks(sender: Any, **kwargs: Any) -> None:
    if os.environ.get("SIGNAL_STYLE_NO_SCHEDULES"):
        return  # a deploy whose code lost its schedules
    sender.add_periodic_task(3600, heartbeat.s(), name="heartbeat every hour")
    sender.add_periodic_task(crontab(minute=30, hour=2), cleanup.s(), name="cleanup at 02:30")


@app.task
def heartbeat() -> None: ...


@app.task
def cleanup() -> None: ...
