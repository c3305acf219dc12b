"""An existing Celery project's app (Celery's tutorial layout: app.py and tasks.py).

Adopting the highly-available beat takes the package and one setting, the
schedule database; `celery -A app beat -S ha` (or `beat_scheduler = "ha"`)
runs it. Its beat_schedule keeps its meaning.
"""

import os

from celery import Celery
from celery.schedules import crontab

app = Celery("app", broker=os.environ.get("BROKER_URL", "redis://127.0.0.1:6379/0"))
app.conf.update(
    include=["tasks"],
    # The one setting: where schedules and runs live (or HABEAT_DATABASE_URL).
    habeat_database_url=os.environ.get(
        "SCHEDULES_DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/schedules"
    ),
    beat_schedule={
        "ping-every-2s": {"task": "tasks.ping", "schedule": 2.0, "args": ("interval",)},
        "report-first-monday": {
            "task": "tasks.report",
            "schedule": crontab(minute=0, hour=9, day_of_month="1-7", day_of_week="mon"),
        },
    },
)
