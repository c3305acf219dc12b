"""A Django project's settings: the scheduler is configured like any Celery setting."""

import os

from celery.schedules import crontab

SECRET_KEY = "example-only"
INSTALLED_APPS = ["shop"]
USE_TZ = True
TIME_ZONE = "Europe/Berlin"

CELERY_BROKER_URL = os.environ.get("BROKER_URL", "redis://127.0.0.1:6379/0")
CELERY_TIMEZONE = TIME_ZONE
CELERY_BEAT_SCHEDULER = "ha"
# The one setting (or HABEAT_DATABASE_URL in the environment).
CELERY_HABEAT_DATABASE_URL = os.environ.get(
    "SCHEDULES_DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/schedules"
)
CELERY_BEAT_SCHEDULE = {
    "ping-every-2s": {"task": "shop.tasks.ping", "schedule": 2.0, "args": ("interval",)},
    "close-day": {"task": "shop.tasks.close_day", "schedule": crontab(minute=30, hour=2)},
}
