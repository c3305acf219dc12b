from celery import Celery
from celery.schedules import crontab
from standin import BROKER_OPTIONS, BROKER_URL, DATABASE_URL

app = Celery("local_time", broker=BROKER_URL)
app.conf.update(habeat_database_url=DATABASE_URL, broker_transport_options=BROKER_OPTIONS)
app.conf.enable_utc = False
app.conf.beat_schedule = {
    "nightly-0230": {"task": "local_time.nightly", "schedule": crontab(minute=30, hour=2)},
    "every-5-minutes": {"task": "local_time.poll", "schedule": crontab(minute="*/5")},
    "every-45s": {"task": "local_time.tick", "schedule": 45},
}
