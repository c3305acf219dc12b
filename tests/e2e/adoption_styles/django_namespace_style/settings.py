from celery.schedules import crontab
from standin import BROKER_OPTIONS, BROKER_URL, DATABASE_URL

TIME_ZONE = "Europe/Berlin"
USE_TZ = True
CELERY_BROKER_URL = BROKER_URL
CELERY_BROKER_TRANSPORT_OPTIONS = BROKER_OPTIONS
CELERY_HABEAT_DATABASE_URL = DATABASE_URL
CELERY_BEAT_SCHEDULER = "ha"
CELERY_BEAT_SCHEDULE = {
    "close-day": {
        "task": "django_namespace_style.close_day",
        "schedule": crontab(minute=30, hour=2),
    },
    "quarter-hourly": {"task": "django_namespace_style.poll", "schedule": crontab(minute="*/15")},
    "first-monday": {
        "task": "django_namespace_style.report",
        "schedule": crontab(minute=0, hour=3, day_of_week=1, day_of_month="1-7"),
    },
    "every-minute": {"task": "django_namespace_style.tick", "schedule": 60.0},
}
