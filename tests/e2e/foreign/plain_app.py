"""A Celery app as a project without celery-habeat writes it: default settings (the
message acknowledged when it arrives), and the plain task the end-to-end tests
schedule, under the same name. It runs in an environment where ``import beat``
fails (``sitecustomize`` in this directory)."""

from __future__ import annotations

import os

import psycopg
from celery import Celery

app = Celery("plain_app", broker=os.environ["CELERY_BROKER_URL"])
app.conf.update(
    broker_transport_options={"global_keyprefix": os.environ["HABEAT_BROKER_KEY_PREFIX"]},
    accept_content=["json"],
    broker_connection_retry_on_startup=True,
    # FOREIGN_REMOTE_CONTROL=0: a consumer that Celery's remote control cannot see.
    worker_enable_remote_control=os.environ.get("FOREIGN_REMOTE_CONTROL", "1") == "1",
)


@app.task(name="e2e.plain_record", bind=True)
def plain_record(self, label):  # type: ignore[no-untyped-def]
    with psycopg.connect(os.environ["E2E_EFFECTS_DSN"], autocommit=True) as conn:
        conn.execute(
            "INSERT INTO e2e_effects (task_id, label) VALUES (%s, %s)", (self.request.id, label)
        )
    return self.request.id
