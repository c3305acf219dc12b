import os

from celery import Celery

app = Celery("signal_style", broker=os.environ["CELERY_BROKER_URL"])
app.conf.habeat_database_url = os.environ["DATABASE_URL"]
app.autodiscover_tasks(["signal_style"])
