"""Publisher confirms on RabbitMQ, against the machine's RabbitMQ (a virtual host of
the test's own): a message the broker refuses (a queue at its length limit with
``reject-publish``) is an error, its run left in the outbox, never one counted as sent
that the broker dropped; once the broker takes messages again, it goes."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator

import pytest
from celery import Celery

from app.factory import create_app
from beat.publish import dispatch
from tests.conftest import SessionEnv
from tests.e2e.rabbitmq import rabbitmq_vhost
from tests.integration.publish.test_dispatch import runs
from tests.integration.publish.test_dispatch_rabbitmq import queued_task_ids

pytestmark = pytest.mark.integration

POLICY = "habeat-full"


@pytest.fixture
def vhost() -> Iterator[str]:
    with rabbitmq_vhost() as url:
        yield url


def app_on(url: str, test_env: SessionEnv, **options: object) -> Celery:
    app = create_app(test_env.settings(broker_url=url))
    if options:
        app.conf.broker_transport_options = options
    return app


def refuse_publishes(url: str, refuse: bool) -> None:
    """A policy on every queue of the vhost: no room, new messages refused (a nack)."""
    vhost = url.rsplit("/", 1)[1]
    if refuse:
        definition = json.dumps({"max-length": 0, "overflow": "reject-publish"})
        args = ["set_policy", "-p", vhost, "--apply-to", "queues", POLICY, ".*", definition]
    else:
        args = ["clear_policy", "-p", vhost, POLICY]
    subprocess.run(["rabbitmqctl", *args], check=True, capture_output=True, timeout=60)


def test_a_publish_rabbitmq_refuses_leaves_the_run_in_the_outbox_and_goes_once_taken(
    vhost: str, test_env: SessionEnv
) -> None:
    app = app_on(vhost, test_env)
    assert dispatch.CeleryPublisher(app) is not None
    assert app.conf.broker_transport_options["confirm_publish"] is True
    [run] = runs(1)
    # The queue exists (Celery declares it with the first publish), then is full.
    warm = dispatch.publish_runs(app, runs(1))
    assert warm.error is None
    queued_task_ids(app)
    refuse_publishes(vhost, True)
    try:
        refused = dispatch.publish_runs(app, [run])
    finally:
        refuse_publishes(vhost, False)
    taken = dispatch.publish_runs(app, [run])
    app.pool.force_close_all()

    assert refused.error is not None, "the broker's refusal is an error"
    assert refused.published == []  # the run stays in the outbox
    assert taken.published == [run.id]


def test_without_confirms_rabbitmq_drops_what_it_refuses_and_the_publish_looks_sent(
    vhost: str, test_env: SessionEnv
) -> None:
    """What a user who turns them off gets (``confirm_publish: False`` is kept): the
    broker drops the message, the run counts as sent; lost-message recovery sends it
    again after twice the visibility timeout."""
    app = app_on(vhost, test_env, confirm_publish=False)
    dispatch.CeleryPublisher(app)
    assert app.conf.broker_transport_options["confirm_publish"] is False
    dispatch.publish_runs(app, runs(1))
    queued_task_ids(app)
    refuse_publishes(vhost, True)
    try:
        [run] = runs(1)
        dropped = dispatch.publish_runs(app, [run])
    finally:
        refuse_publishes(vhost, False)
    app.pool.force_close_all()

    assert dropped.error is None
    assert dropped.published == [run.id]
