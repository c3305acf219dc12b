from celery import Celery
from standin import BROKER_OPTIONS, BROKER_URL, DATABASE_URL

app = Celery("signal_style", broker=BROKER_URL)
app.conf.update(habeat_database_url=DATABASE_URL, broker_transport_options=BROKER_OPTIONS)
app.autodiscover_tasks(["signal_style"])
