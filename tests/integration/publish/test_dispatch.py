"""Publishing against real Redis: producer batches, in order, all or nothing per
chunk, and a broker that is down leaves every run to the outbox."""

from __future__ import annotations

import socket
import threading
import time
import uuid
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import pytest
import redis
from celery import chain, group

from app.factory import create_app
from beat.errors import StaleEpoch
from beat.models import RunToPublish
from beat.publish import dispatch
from beat.publish.redis_pushes import FOLD, fold_pushes
from beat.schedule.workflow import WORKFLOW_TASK, stored_canvas, workflow_kwargs
from tests.conftest import SessionEnv
from tests.integration.helpers import broker_messages, count_stamped_pushes, task_ids

pytestmark = pytest.mark.integration


def runs(count: int) -> list[RunToPublish]:
    return [
        RunToPublish(
            id=uuid.uuid4(),
            task="tasks.demo.add",
            args=[index, 1],
            kwargs={},
            options={},
            schedule_name=f"s{index}",
            fire_at=datetime.now(UTC),
            attempt=0,
        )
        for index in range(count)
    ]


def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_runs_are_published_in_order_across_chunks_with_their_headers(
    test_env: SessionEnv, redis_client: redis.Redis
) -> None:
    app = create_app(test_env.settings())
    batch = runs(dispatch.CHUNK * 2 + 7)

    result = dispatch.publish_runs(app, batch)

    assert result.error is None
    assert result.published == [run.id for run in batch]
    messages = broker_messages(redis_client, test_env.broker_key_prefix)
    assert task_ids(messages) == [str(run.id) for run in batch]
    headers = messages[-1]["headers"]
    assert headers[dispatch.SCHEDULE_HEADER] == batch[-1].schedule_name
    assert headers[dispatch.ATTEMPT_HEADER] == 1
    assert headers["argsrepr"] == repr(batch[-1].args)


def publish_at_watched(
    app: Any, redis_client: redis.Redis, queue_key: str, count: int | list[RunToPublish]
) -> tuple[dispatch.PublishResult, list[int]]:
    """``publish_at`` of ``count`` runs (or those given) half a second ahead, with the
    queue's length sampled until just before the deadline."""
    deadline = time.monotonic() + 0.5
    seen_early: list[int] = []

    def early_check() -> None:
        while time.monotonic() < deadline - 0.02:
            seen_early.append(int(redis_client.llen(queue_key)))  # type: ignore[arg-type]
            time.sleep(0.01)

    watcher = threading.Thread(target=early_check)
    watcher.start()
    result = dispatch.publish_at(app, runs(count) if isinstance(count, int) else count, deadline)
    watcher.join()
    assert time.monotonic() >= deadline
    return result, seen_early


def test_publish_at_sends_nothing_before_the_deadline(
    test_env: SessionEnv, redis_client: redis.Redis
) -> None:
    app = create_app(test_env.settings())
    key = f"{test_env.broker_key_prefix}celery"

    result, seen_early = publish_at_watched(app, redis_client, key, 50)

    assert result.error is None
    assert len(result.published) == 50
    assert seen_early, "the watcher looked before the deadline"
    assert max(seen_early) == 0, "messages left before their time"
    assert redis_client.llen(key) == 50


def test_publish_at_sends_no_workflow_before_the_deadline(
    test_env: SessionEnv, redis_client: redis.Redis
) -> None:
    """Celery's canvas code sends a workflow's first steps itself, keeping to no batch:
    a workflow claimed ahead is sent after its deadline, with the others (seen in the
    chaos suite: its steps started before their fire time)."""
    app = create_app(test_env.settings())
    key = f"{test_env.broker_key_prefix}celery"
    add = app.signature("tasks.demo.add", args=[1, 2], immutable=True)
    workflow = RunToPublish(
        id=uuid.uuid4(),
        task=WORKFLOW_TASK,
        args=[],
        kwargs=workflow_kwargs(stored_canvas(chain(add, group(add, add)))),
        options={},
        schedule_name="fan-out",
        fire_at=datetime.now(UTC),
        attempt=0,
    )

    result, seen_early = publish_at_watched(app, redis_client, key, [*runs(3), workflow])

    assert result.error is None
    assert set(result.published) >= {workflow.id}
    assert seen_early, "the watcher looked before the deadline"
    assert max(seen_early) == 0, "a workflow's steps left before their time"
    assert redis_client.llen(key) == 4


@pytest.mark.parametrize("send", ["publish_runs", "publish_at"])
def test_pushes_to_one_queue_are_folded_and_the_queue_holds_every_run_in_order(
    test_env: SessionEnv,
    redis_client: redis.Redis,
    monkeypatch: pytest.MonkeyPatch,
    send: str,
) -> None:
    """On kombu's Redis batch the layout ``beat.publish.redis_pushes`` and
    ``beat.publish.redis_envelopes`` expect is there (else the pushes would not be folded, and
    a burst's send would take about four times longer; nor stamped, and its build
    about twice as long)."""
    folds: list[tuple[bool, int]] = []
    original = fold_pushes
    stamped = count_stamped_pushes(monkeypatch)

    def watched(producer: Any) -> bool:
        folded = original(producer)
        stack = producer._batch_local.current.session.pipeline.command_stack
        folds.append((folded, len(stack)))
        return folded

    monkeypatch.setattr(dispatch, "fold_pushes", watched)
    app = create_app(test_env.settings())
    batch = runs(2 * FOLD + 10)
    if send == "publish_runs":
        result = dispatch.publish_runs(app, batch)
    else:
        result = dispatch.publish_at(app, batch, time.monotonic() + 0.2)

    assert result.error is None
    assert result.published == [run.id for run in batch]
    messages = broker_messages(redis_client, test_env.broker_key_prefix)
    assert task_ids(messages) == [str(run.id) for run in batch]
    assert folds
    assert all(folded for folded, _ in folds)
    # publish_runs: one command per chunk of CHUNK; publish_at: one per FOLD messages.
    expected = len(batch) // dispatch.CHUNK + 1 if send == "publish_runs" else 3
    assert sum(commands for _, commands in folds) == expected
    # kombu publishes a template's first three runs of each batch.
    batches = len(batch) // dispatch.CHUNK + 1 if send == "publish_runs" else 1
    assert stamped == [len(batch) - 3 * batches]


def test_a_broker_that_is_down_publishes_nothing_and_says_why(test_env: SessionEnv) -> None:
    app = create_app(test_env.settings(broker_url=f"redis://127.0.0.1:{closed_port()}/0"))
    app.conf.broker_connection_timeout = 0.5  # kombu retries connecting for this long

    now = dispatch.publish_runs(app, runs(3))
    later = dispatch.publish_at(app, runs(3), time.monotonic())

    for result in (now, later):
        assert result.published == []
        assert result.error is not None


def test_a_run_whose_message_cannot_be_built_is_rejected_alone(
    test_env: SessionEnv, redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run whose message cannot be built is rejected alone. Finding 14 of issue 15."""
    app = create_app(test_env.settings())
    good = runs(10)
    bad = replace(good[1], options={"headers": "oops"})
    expired = replace(good[2], options={"expires": "soon"})  # not a time
    unserialisable = replace(good[5], args=[object()])  # among stamped runs
    batch = [good[0], bad, expired, *good[3:5], unserialisable, *good[6:]]
    sent = [run for run in batch if run not in (bad, expired, unserialisable)]
    stamped = count_stamped_pushes(monkeypatch)

    for result in (
        dispatch.publish_runs(app, batch),
        dispatch.publish_at(app, batch, time.monotonic()),
    ):
        assert result.error is None
        assert result.published == [run.id for run in sent]
        assert [(entry.run.id, entry.error.split(":")[0]) for entry in result.rejected] == [
            (bad.id, "ValueError"),  # refused by beat.schedule.options before Celery sees them
            (expired.id, "ValueError"),
            (unserialisable.id, "EncodeError"),
        ]
    messages = broker_messages(redis_client, test_env.broker_key_prefix)
    assert task_ids(messages) == [str(run.id) for run in sent] * 2
    assert stamped == [2 * (len(sent) - 3)]


def test_a_broker_error_while_a_message_is_built_stops_the_batch(
    test_env: SessionEnv, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A connection error is the broker's, not the run's: nothing is rejected, and
    the runs stay in the outbox. Finding 14 of issue 15."""
    app = create_app(test_env.settings())

    def broker_gone(*args: object, **kwargs: object) -> None:
        raise redis.ConnectionError("Connection reset by peer")

    monkeypatch.setattr(app, "send_task", broker_gone)
    result = dispatch.publish_runs(app, runs(3))

    assert result.published == []
    assert result.rejected == []
    assert isinstance(result.error, redis.ConnectionError)


def test_a_transport_that_cannot_batch_sends_nothing_before_the_deadline(
    test_env: SessionEnv, redis_client: redis.Redis
) -> None:
    """With ``retry_on_timeout`` kombu refuses to batch on Redis and publishes each
    message as it is built: they must then be built at the deadline, not ahead.
    Finding 10 of issue 15."""
    app = create_app(test_env.settings())
    options = app.conf.broker_transport_options
    app.conf.broker_transport_options = {**options, "retry_on_timeout": True}
    key = f"{test_env.broker_key_prefix}celery"

    result, seen_early = publish_at_watched(app, redis_client, key, 5)

    assert result.error is None
    assert seen_early, "the watcher looked before the deadline"
    assert max(seen_early) == 0, "messages left before their time"
    assert redis_client.llen(key) == 5


def test_publish_at_sends_nothing_when_the_last_check_before_the_send_refuses(
    test_env: SessionEnv, redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    app = create_app(test_env.settings())

    def lease_lost() -> None:
        raise StaleEpoch("another process leads")

    stamped = count_stamped_pushes(monkeypatch)
    with pytest.raises(StaleEpoch):
        dispatch.publish_at(app, runs(50), time.monotonic() + 0.1, before_send=lease_lost)
    assert broker_messages(redis_client, test_env.broker_key_prefix) == []
    assert stamped == [47], "stamped pushes were waiting in the batch, and were dropped"
