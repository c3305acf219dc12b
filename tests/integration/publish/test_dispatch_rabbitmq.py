"""Publishing against the machine's RabbitMQ (a virtual host of the test's own): the
transport takes the path it supports, a plain ``producer.publish`` per message, and a
run the broker took is never sent again because a later one failed."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import pytest
from celery import Celery
from kombu import Producer

from app.factory import create_app
from beat.models import RunToPublish
from beat.publish import dispatch
from tests.conftest import SessionEnv
from tests.e2e.rabbitmq import rabbitmq_vhost
from tests.integration.publish.test_dispatch import runs

pytestmark = pytest.mark.integration


@pytest.fixture
def app(test_env: SessionEnv) -> Iterator[Celery]:
    with rabbitmq_vhost() as url:
        app = create_app(test_env.settings(broker_url=url))
        yield app
        app.pool.force_close_all()


def twins(count: int, fire_at: datetime, *, same_options: bool = True) -> list[RunToPublish]:
    """One-offs of one task due at one instant, with the same options (one template) or
    each its own."""
    return [
        replace(run, fire_at=fire_at, options={"expires": 600 if same_options else 600 + index})
        for index, run in enumerate(runs(count))
    ]


def queued_task_ids(app: Celery, queue: str = "celery") -> list[str]:
    """The task IDs waiting in ``queue``, oldest first (taken off the queue)."""
    found: list[str] = []
    with app.connection_for_read() as connection:
        channel = connection.default_channel
        while (message := channel.basic_get(queue, no_ack=True)) is not None:
            found.append(message.headers["id"])
    return found


def send(app: Celery, how: str, batch: list[RunToPublish]) -> dispatch.PublishResult:
    if how == "publish_runs":
        return dispatch.publish_runs(app, batch)
    return dispatch.publish_at(app, batch, 0.0)


def test_only_kombu_s_redis_channel_takes_the_batch_path(app: Celery, test_env: SessionEnv) -> None:
    redis_app = create_app(test_env.settings())
    retrying = create_app(test_env.settings())
    retrying.conf.broker_transport_options = {
        **retrying.conf.broker_transport_options,
        "retry_on_timeout": True,
    }
    taken = {}
    for name, each in {"rabbitmq": app, "redis": redis_app, "redis-retrying": retrying}.items():
        with each.producer_or_acquire() as producer:
            taken[name] = dispatch.batches(producer)
    assert taken == {"rabbitmq": False, "redis": True, "redis-retrying": False}


@pytest.mark.parametrize("how", ["publish_runs", "publish_at"])
def test_runs_of_one_template_at_one_instant_are_each_published_once_on_rabbitmq(
    app: Celery, how: str
) -> None:
    """issue 38, finding 4: kombu's batch on RabbitMQ sends each message at once, and no
    Redis envelope can be stamped from it: every run goes through ``producer.publish``."""
    batch = twins(5, datetime.now(UTC).replace(microsecond=0))

    result = send(app, how, batch)

    assert result.error is None
    assert result.published == [run.id for run in batch]
    assert queued_task_ids(app) == [str(run.id) for run in batch]


@pytest.mark.parametrize("how", ["publish_runs", "publish_at"])
def test_a_broker_error_reports_the_runs_the_broker_took_before_it_as_published(
    app: Celery, how: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """issue 38, finding 4: the third publish fails (the connection dropped): the two
    runs RabbitMQ took are published, not sent again; the others stay in the outbox."""
    batch = twins(5, datetime.now(UTC).replace(microsecond=0), same_options=False)
    publish = Producer.publish
    calls = 0

    def third_fails(self: Producer, *args: Any, **kwargs: Any) -> Any:
        nonlocal calls
        calls += 1
        if calls == 3:
            raise ConnectionResetError("the connection dropped")
        return publish(self, *args, **kwargs)

    monkeypatch.setattr(Producer, "publish", third_fails)

    result = send(app, how, batch)

    assert "the connection dropped" in str(result.error)
    assert result.published == [run.id for run in batch[:2]]
    assert queued_task_ids(app) == [str(run.id) for run in batch[:2]]
