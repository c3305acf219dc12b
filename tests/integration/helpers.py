"""Helpers shared by the integration and end-to-end tests."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import uuid
from collections.abc import Iterator, Sequence
from datetime import datetime, timedelta, tzinfo
from pathlib import Path
from typing import Any

import psycopg
import pytest
import redis
from celery import Celery
from celery.bin.celery import celery as celery_main
from click.testing import CliRunner, Result
from psycopg import sql
from sqlalchemy import func, insert, select, text
from sqlalchemy.engine import make_url

from beat.models import RunState
from beat.ops.schedules import Schedules
from beat.publish import redis_envelopes
from beat.store.all_roles import Store
from beat.store.schema import ensure_database, migrate
from beat.store.tables import runs
from tests.conftest import ADMIN_DATABASE_URL, SessionEnv

ROOT = Path(__file__).resolve().parents[2]


def add_interval_schedules(
    schedules: Schedules,
    count: int,
    *,
    every: float,
    start_at: datetime,
    task: str = "tasks.demo.add",
) -> None:
    for index in range(count):
        schedules.create(
            f"s{index:05d}",
            task,
            every=every,
            start_at=start_at,
            args=[index, 1],
            allow_unregistered=True,
        )


def make_due(store: Store, seconds_ago: float) -> None:
    """Move every schedule's next fire time into the past, as if beat had been down."""
    with store.engine.begin() as conn:
        conn.execute(
            text(
                "UPDATE beat_schedules SET next_fire_at = now() - make_interval(secs => :ago),"
                " anchor_at = CASE WHEN anchor_at IS NULL THEN NULL"
                " ELSE now() - make_interval(secs => :ago) END"
            ),
            {"ago": seconds_ago},
        )


def run_rows(store: Store, **where: Any) -> list[Any]:
    clauses = " AND ".join(f"{key} = :{key}" for key in where) or "true"
    with store.engine.connect() as conn:
        return list(
            conn.execute(
                text(f"SELECT * FROM beat_runs WHERE {clauses} ORDER BY schedule_name, fire_at"),
                where,
            )
        )


def finished_runs(
    store: Store,
    name: str,
    states: Sequence[RunState],
    *,
    ago: timedelta = timedelta(0),
    error: str = "ValueError: boom",
) -> None:
    """Runs of schedule ``name`` in ``states``, oldest first, that fired a minute apart
    after its newest run (each call adds newer runs) and finished ``ago`` before now (the
    database's); each but a success with ``error``."""
    schedule = store.get_schedule(name)
    now = store.now()
    first = now - timedelta(minutes=len(states)) + _after_newest_run(store, name)
    rows: list[dict[str, Any]] = [
        {
            "id": uuid.uuid4(),
            "schedule_id": schedule.id,
            "schedule_name": name,
            "task": schedule.definition.task,
            "state": state.value,
            "fire_at": first + timedelta(minutes=index),
            "claimed_at": now - ago,
            "finished_at": now - ago,
            "error": error if state is not RunState.SUCCEEDED else None,
        }
        for index, state in enumerate(states)
    ]
    with store.engine.begin() as conn:
        conn.execute(insert(runs), rows)


def _after_newest_run(store: Store, name: str) -> timedelta:
    """How far past now fire times must start to follow the schedule's newest run."""
    with store.engine.connect() as conn:
        newest: datetime | None = conn.execute(
            select(func.max(runs.c.fire_at)).where(runs.c.schedule_name == name)
        ).scalar_one()
    if newest is None:
        return timedelta(0)
    return max(timedelta(0), newest - store.now() + timedelta(hours=1))


def schedule_row(store: Store, name: str) -> Any:
    with store.engine.connect() as conn:
        return conn.execute(
            text("SELECT * FROM beat_schedules WHERE name = :name"), {"name": name}
        ).one()


def broker_messages(
    client: redis.Redis, broker_prefix: str, queue: str = "celery"
) -> list[dict[str, Any]]:
    """The messages waiting in a Redis broker queue (kombu's list), oldest first."""
    raw = client.lrange(f"{broker_prefix}{queue}", 0, -1)
    return [json.loads(item) for item in reversed(raw)]


def task_ids(messages: list[dict[str, Any]]) -> list[str]:
    return [message["headers"]["id"] for message in messages]


def seconds(delta: timedelta) -> float:
    return delta.total_seconds()


def slow_client_clock(monkeypatch: pytest.MonkeyPatch, behind: timedelta) -> None:
    """Set the API's clock (``datetime.now`` in ``beat.ops.schedule_commands``) ``behind`` the
    database's."""

    class SlowClock(datetime):
        @classmethod
        def now(cls, tz: tzinfo | None = None) -> datetime:  # type: ignore[override]
            return datetime.now(tz) - behind

    monkeypatch.setattr("beat.ops.schedule_commands.datetime", SlowClock)


# -- the schedules command, in-process ------------------------------------------------------


def invoke(app: Celery, *args: str) -> Result:
    """``celery -A <app> schedules <args>`` in-process; exceptions other than exits propagate."""
    return CliRunner().invoke(celery_main, ["-A", app, "schedules", *args], catch_exceptions=False)


def celery_cli(test_env: SessionEnv, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """The real ``python -m celery -A app schedules <args>``, with ``env`` added to this
    session's environment."""
    return subprocess.run(
        [sys.executable, "-m", "celery", "-A", "app", "schedules", *args],
        cwd=ROOT,
        env=test_env.process_env(**env),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def as_json(result: Result) -> Any:
    assert result.exit_code == 0, f"exit {result.exit_code}: {result.stderr}"
    return json.loads(result.stdout)


def error_lines(result: Result) -> list[str]:
    return [line for line in result.stderr.splitlines() if line.startswith("Error:")]


def table_rows(store: Store) -> list[tuple[Any, ...]]:
    """Everything the CLI could write, to compare before and after a refused command."""
    with store.engine.connect() as conn:
        schedules = conn.execute(text("SELECT * FROM beat_schedules ORDER BY id")).all()
        runs = conn.execute(text("SELECT * FROM beat_runs ORDER BY id")).all()
        leader = conn.execute(text("SELECT * FROM beat_leader ORDER BY name")).all()
    return [tuple(row) for row in [*schedules, *runs, *leader]]


def count_stamped_pushes(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts the messages pushed from a stamped envelope (``beat.publish.redis_envelopes``)
    from now on: one count, kept up to date."""
    counts = [0]
    original = redis_envelopes.Envelopes.push

    def counted(self: redis_envelopes.Envelopes, *args: Any) -> bool:
        pushed = original(self, *args)
        counts[0] += pushed
        return pushed

    monkeypatch.setattr(redis_envelopes.Envelopes, "push", counted)
    return counts


@contextlib.contextmanager
def database_at(test_env: SessionEnv, revision: str) -> Iterator[Store]:
    """A store on a database of its own migrated to ``revision`` (dropped after)."""
    name = f"habeat_test_{uuid.uuid4().hex[:8]}"
    url = make_url(test_env.database_url).set(database=name)
    admin = make_url(ADMIN_DATABASE_URL).set(drivername="postgresql")
    store = Store.connect(url.render_as_string(hide_password=False))
    try:
        ensure_database(store.engine)
        migrate(store.engine, revision)
        yield store
    finally:
        store.dispose()
        with psycopg.connect(admin.render_as_string(hide_password=False), autocommit=True) as c:
            c.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )
