"""Shared fixtures: each test session gets its own PostgreSQL database and its own
Redis key prefix (on a dedicated Redis DB number), and removes both at the end.

PostgreSQL and Redis must be running (``scripts/services.sh`` starts them).
When one is missing, tests that need it are skipped locally and fail under CI.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import NoReturn

import psycopg
import pytest
import redis
from sqlalchemy import text
from sqlalchemy.engine import make_url

from app.settings import Settings
from beat.store.all_roles import Store

#: A database the tests may connect to in order to create and drop their own.
ADMIN_DATABASE_URL = os.environ.get(
    "HABEAT_TEST_ADMIN_DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/postgres"
)
#: The Redis DB number reserved for tests; keys are prefixed per session on top of that.
REDIS_TEST_URL = os.environ.get("HABEAT_TEST_REDIS_URL", "redis://127.0.0.1:6379/14")
IN_CI = os.environ.get("CI", "").lower() in {"1", "true", "yes"}


def _missing(service: str, exc: Exception) -> None:
    not_installed(f"{service} is not reachable ({exc}); start it with scripts/services.sh")


def not_installed(message: str) -> NoReturn:
    """A server or program the test needs is missing: skipped on a developer's machine,
    failed in CI (which installs everything)."""
    if IN_CI:
        pytest.fail(message, pytrace=False)
    pytest.skip(message)


@dataclass(frozen=True)
class SessionEnv:
    """Where this session's tests keep their state."""

    database_url: str  # SQLAlchemy URL (postgresql+psycopg://...)
    redis_url: str
    key_prefix: str

    @property
    def broker_key_prefix(self) -> str:
        return f"{self.key_prefix}:broker:"

    def settings(self, **overrides: object) -> Settings:
        values: dict[str, object] = {
            "database_url": self.database_url,
            "redis_url": self.redis_url,
            "broker_url": self.redis_url,
            "key_prefix": self.key_prefix,
            "broker_key_prefix": self.broker_key_prefix,
        }
        values.update(overrides)
        return Settings(**values)  # type: ignore[arg-type]

    def process_env(self, **overrides: str) -> dict[str, str]:
        """Environment for a real `celery` subprocess pointed at this session's state."""
        env = dict(os.environ)
        env.update(
            DATABASE_URL=self.database_url,
            REDIS_URL=self.redis_url,
            CELERY_BROKER_URL=self.redis_url,
            HABEAT_KEY_PREFIX=self.key_prefix,
            HABEAT_BROKER_KEY_PREFIX=self.broker_key_prefix,
            PYTHONUNBUFFERED="1",
        )
        env.update(overrides)
        return env


@pytest.fixture(scope="session")
def test_env() -> Iterator[SessionEnv]:
    suffix = uuid.uuid4().hex[:10]
    database = f"habeat_test_{suffix}"
    admin = (
        make_url(ADMIN_DATABASE_URL)
        .set(drivername="postgresql")
        .render_as_string(hide_password=False)
    )
    try:
        with psycopg.connect(admin, autocommit=True, connect_timeout=3) as conn:
            conn.execute(f'CREATE DATABASE "{database}"')
    except psycopg.OperationalError as exc:
        _missing("PostgreSQL", exc)
    client = redis.Redis.from_url(REDIS_TEST_URL)
    try:
        client.ping()
    except redis.RedisError as exc:
        _missing("Redis", exc)
    database_url = (
        make_url(ADMIN_DATABASE_URL)
        .set(drivername="postgresql+psycopg", database=database)
        .render_as_string(hide_password=False)
    )
    env = SessionEnv(
        database_url=database_url, redis_url=REDIS_TEST_URL, key_prefix=f"habeat-test-{suffix}"
    )
    store = Store.connect(database_url, leader_name=env.key_prefix)
    store.migrate()
    store.dispose()
    try:
        yield env
    finally:
        _delete_keys(client, env.key_prefix)
        client.close()
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')


def _delete_keys(client: redis.Redis, prefix: str) -> None:
    batch = list(client.scan_iter(match=f"{prefix}*", count=1000))
    while batch:
        client.delete(*batch[:1000])
        batch = batch[1000:]


@pytest.fixture
def store(test_env: SessionEnv) -> Iterator[Store]:
    """A store on an empty schema (tables truncated before each test)."""
    store = Store.connect(test_env.database_url, leader_name=test_env.key_prefix)
    with store.engine.begin() as conn:
        tables = (
            "beat_runs, beat_schedules, beat_leader, beat_run_minutes, beat_run_blocks,"
            " beat_run_summary,"
            " beat_unrecorded_consumers, beat_workers, beat_incidents, beat_monitor_progress,"
            " beat_channels, beat_notifications, beat_schedule_changes, beat_api_tokens,"
            " beat_idempotency_keys"
        )
        conn.execute(text(f"TRUNCATE {tables} RESTART IDENTITY"))
    yield store
    store.dispose()


@pytest.fixture
def redis_client(test_env: SessionEnv) -> Iterator[redis.Redis]:
    """A Redis client whose test keys are removed before each test."""
    client = redis.Redis.from_url(test_env.redis_url)
    _delete_keys(client, test_env.key_prefix)
    yield client
    client.close()
