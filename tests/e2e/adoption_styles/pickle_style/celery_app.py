from celery import Celery
from celery.schedules import crontab
from standin import BROKER_OPTIONS, BROKER_URL, DATABASE_URL

app = Celery("pickle_style", broker=BROKER_URL)
app.conf.update(
    habeat_database_url=DATABASE_URL,
    broker_transport_options=BROKER_OPTIONS,
    task_serializer="pickle",
    accept_content=["pickle"],
    result_serializer="pickle",
    timezone="Asia/Kolkata",
    beat_schedule={
        "pickled every 2s": {"task": "pickle_style.job", "schedule": 2.0, "args": (1, "a")},
        "pickled at 05:45": {"task": "pickle_style.job", "schedule": crontab(minute=45, hour=5)},
    },
)


@app.task
def job(*args: object) -> None: ...
