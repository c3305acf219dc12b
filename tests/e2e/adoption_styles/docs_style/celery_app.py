from typing import Any

from celery import Celery
from celery.schedules import crontab
from standin import BROKER_OPTIONS, BROKER_URL, DATABASE_URL

app = Celery("docs_style", broker=BROKER_URL)
app.conf.update(habeat_database_url=DATABASE_URL, broker_transport_options=BROKER_OPTIONS)


@app.on_after_configure.connect
def setup_periodic_tasks(sender: Any, **kwargs: Any) -> None:
    # Calls test('hello') every 10 seconds.
    sender.add_periodic_task(10.0, test.s("hello"), name="add every 10")
    # Calls test('hello') every 30 seconds; it uses the same signature as the previous
    # entry, so an explicit name avoids a collision with 'add every 10'.
    sender.add_periodic_task(30.0, test.s("hello"), name="add every 30")
    # Calls test('world') every 30 seconds.
    sender.add_periodic_task(30.0, test.s("world"), expires=10)
    # Executes every Monday morning at 7:30 a.m.
    sender.add_periodic_task(crontab(hour=7, minute=30, day_of_week=1), test.s("Happy Mondays!"))


@app.task
def test(arg: str) -> None:
    print(arg)
