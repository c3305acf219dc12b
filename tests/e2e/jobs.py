"""Jobs used by the end-to-end tests: each records its execution in PostgreSQL,
so a test can count how often every run really ran."""

from __future__ import annotations

import os

import psycopg

from app import celery_app


@celery_app.task(name="e2e.record", bind=True)
def record(self: object, label: str) -> str:
    task_id = self.request.id  # type: ignore[attr-defined]
    with psycopg.connect(os.environ["E2E_EFFECTS_DSN"], autocommit=True) as conn:
        conn.execute("INSERT INTO e2e_effects (task_id, label) VALUES (%s, %s)", (task_id, label))
    return task_id
