import os

from celery import Celery
from celery.schedules import crontab

app = Celery("local_time", broker=os.environ["CELERY_BROKER_URL"])
app.conf.habeat_database_url = os.environ["DATABASE_URL"]
app.conf.enable_utc = False
app.conf.beat_schedule = {
    "nightly at 02:30": {"task": "local_time.nightly", "schedule": crontab(minute=30, hour=2)},
}
