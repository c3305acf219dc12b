from datetime import timedelta

from celery.schedules import crontab
from standin import BROKER_OPTIONS, BROKER_URL, DATABASE_URL

BROKER_URL = BROKER_URL
BROKER_TRANSPORT_OPTIONS = BROKER_OPTIONS
CELERY_TIMEZONE = "America/New_York"
CELERY_HABEAT_DATABASE_URL = DATABASE_URL
CELERYBEAT_SCHEDULE = {
    "flush-buffers": {"task": "old_settings_style.flush", "schedule": timedelta(seconds=10)},
    "check-monitors": {"task": "old_settings_style.check", "schedule": crontab(minute="*/5")},
    "nightly-cleanup": {
        "task": "old_settings_style.cleanup",
        "schedule": crontab(minute=15, hour=1),
        "options": {"expires": 3600},
    },
    "weekday-digest": {
        "task": "old_settings_style.digest",
        "schedule": crontab(minute=0, hour="2,9", day_of_week="mon-fri"),
    },
}
