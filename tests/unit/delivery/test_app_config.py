"""A worker reads the scheduler's configuration once per app, and again when what it
reads changed (``beat.delivery.app_config``)."""

from __future__ import annotations

import pytest
from celery import Celery

from beat.delivery.app_config import delivery_config

URL = "postgresql+psycopg://postgres@127.0.0.1/x"


def app_with(**conf: object) -> Celery:
    app = Celery("config-test", set_as_current=False)
    app.conf.update(habeat_database_url=URL, habeat_redis_url="redis://127.0.0.1:1/0", **conf)
    app.finalize()
    return app


def test_an_unchanged_configuration_is_read_once() -> None:
    app = app_with(habeat_lease_timeout=30)

    assert delivery_config(app.conf) is delivery_config(app.conf)


def test_a_key_set_on_the_app_afterwards_is_read() -> None:
    app = app_with(habeat_lease_timeout=30)
    delivery_config(app.conf)

    app.conf.habeat_lease_timeout = 12

    assert delivery_config(app.conf).lease_timeout == 12


def test_a_variable_set_afterwards_is_read(monkeypatch: pytest.MonkeyPatch) -> None:
    app = app_with()
    before = delivery_config(app.conf).lease_timeout

    monkeypatch.setenv("HABEAT_LEASE_TIMEOUT", str(before + 7))

    assert delivery_config(app.conf).lease_timeout == before + 7


def test_each_app_has_its_own_configuration() -> None:
    first, second = app_with(habeat_lease_timeout=10), app_with(habeat_lease_timeout=20)

    assert delivery_config(first.conf).lease_timeout == 10
    assert delivery_config(second.conf).lease_timeout == 20
