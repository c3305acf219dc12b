"""Fixtures of the import tests: the sources made by their own packages. A
django-celery-beat database migrated by django-celery-beat (Django configured in this
process), a second one left at an older migration, each a scratch database of its
own; RedBeat entries under a key prefix of this session; an app that knows the tasks
the sources name."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import psycopg
import pytest
import redis
from celery import Celery
from sqlalchemy.engine import make_url

from app.factory import create_app
from tests.conftest import ADMIN_DATABASE_URL, SessionEnv

#: The django-celery-beat migration the "older schema" database stops at: before
#: PeriodicTask.expire_seconds (0012).
OLDER_MIGRATION = "0011_auto_20190508_0153"

#: The tasks the sources' rows name.
KNOWN_TASKS = ("tasks.demo.add", "tasks.demo.report", "tasks.demo.heartbeat")


@dataclass(frozen=True)
class DjangoDatabases:
    """The URLs of the two django-celery-beat databases (as a user gives them)."""

    current: str
    older: str


def _admin_url() -> str:
    return make_url(ADMIN_DATABASE_URL).set(drivername="postgresql").render_as_string(False)


@pytest.fixture(scope="session")
def django_databases(test_env: SessionEnv) -> Iterator[DjangoDatabases]:
    """Two scratch databases migrated by django-celery-beat, with Django set up in this
    process on them (``default``: every migration; ``older``: up to
    ``OLDER_MIGRATION``); dropped at the end."""
    import django
    from django.conf import settings
    from django.core.management import call_command
    from django.db import connections

    suffix = uuid.uuid4().hex[:10]
    names = {"default": f"habeat_dcb_{suffix}", "older": f"habeat_dcb_old_{suffix}"}
    with psycopg.connect(_admin_url(), autocommit=True) as conn:
        for name in names.values():
            conn.execute(f'CREATE DATABASE "{name}"')
    admin = make_url(ADMIN_DATABASE_URL)
    settings.configure(
        DATABASES={
            alias: {
                "ENGINE": "django.db.backends.postgresql",
                "NAME": name,
                "USER": admin.username or "postgres",
                "HOST": admin.host or "127.0.0.1",
                "PORT": str(admin.port or 5432),
            }
            for alias, name in names.items()
        },
        INSTALLED_APPS=["django_celery_beat"],
        USE_TZ=True,
        TIME_ZONE="UTC",
        DEFAULT_AUTO_FIELD="django.db.models.AutoField",
    )
    django.setup()
    call_command("migrate", "django_celery_beat", database="default", verbosity=0)
    call_command("migrate", "django_celery_beat", OLDER_MIGRATION, database="older", verbosity=0)
    url = admin.set(drivername="postgresql")
    try:
        yield DjangoDatabases(
            current=url.set(database=names["default"]).render_as_string(False),
            older=url.set(database=names["older"]).render_as_string(False),
        )
    finally:
        connections.close_all()
        with psycopg.connect(_admin_url(), autocommit=True) as conn:
            for name in names.values():
                conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def django_rows(django_databases: DjangoDatabases) -> Iterator[Any]:
    """django-celery-beat's models on an empty ``default`` database (emptied after)."""
    from django_celery_beat import models

    yield models
    for model in (
        models.PeriodicTask,
        models.IntervalSchedule,
        models.CrontabSchedule,
        models.ClockedSchedule,
        models.SolarSchedule,
    ):
        model.objects.all().delete()


@pytest.fixture
def source_app(test_env: SessionEnv) -> Celery:
    """The app being moved: this session's scheduler settings, and the tasks the
    sources name."""
    app = create_app(test_env.settings())
    app.loader.import_default_modules()  # the demo jobs: tasks.demo
    assert set(KNOWN_TASKS) <= set(app.tasks)
    return app


@pytest.fixture
def redbeat_prefix(test_env: SessionEnv, redis_client: redis.Redis) -> Iterator[str]:
    """A RedBeat key prefix of this test's own on the session's Redis (removed after)."""
    prefix = f"{test_env.key_prefix}:redbeat-{uuid.uuid4().hex[:6]}:"
    yield prefix
    keys = list(redis_client.scan_iter(match=f"{prefix}*"))
    if keys:
        redis_client.delete(*keys)
