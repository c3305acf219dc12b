"""Reading the Redis broker for the task IDs it still holds (finding 4: a message
the broker lost is noticed without waiting for twice the visibility timeout).

Messages are published with ``send_task`` by an app configured like the
project's (a ``global_keyprefix`` per test session) and consumed with kombu's own
channel, so the keys and envelopes are the real ones.
"""

from __future__ import annotations

import os
import socket
import time
import tracemalloc
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from celery import Celery
from kombu import Consumer, Exchange, Queue
from kombu.message import Message

from app.factory import create_app
from beat.publish.inventory import held_task_ids, queue_of
from tests.conftest import SessionEnv

pytestmark = pytest.mark.integration

TASK = "tasks.demo.add"
#: The measurement on a long backlog runs only when this is set (it takes seconds).
MEASURE = os.environ.get("HABEAT_MEASURE_BROKER_SCAN", "") == "1"


@pytest.fixture
def app(test_env: SessionEnv, redis_client: redis.Redis) -> Iterator[Celery]:
    app = create_app(test_env.settings())
    app.conf.task_routes = {"tasks.routed": {"queue": "routed"}}
    app.conf.task_queues = [
        Queue("celery"),
        Queue("bound", Exchange("jobs", type="direct"), routing_key="jobs.bound"),
    ]
    yield app
    app.close()


def publish(app: Celery, task: str = TASK, **options: Any) -> str:
    task_id = str(uuid.uuid4())
    app.send_task(task, args=[1, 2], task_id=task_id, **options)
    return task_id


def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.mark.parametrize(
    ("task", "options", "queue", "key_suffix"),
    [
        pytest.param(TASK, {}, "celery", "", id="plain"),
        pytest.param(TASK, {"priority": 5}, "celery", "\x06\x163", id="priority"),
        pytest.param(TASK, {"queue": "named"}, "named", "", id="named-queue"),
        pytest.param("tasks.routed", {}, "routed", "", id="task-routes"),
        pytest.param("tasks.routed", {"queue": "named"}, "named", "", id="option-over-route"),
        pytest.param(
            TASK,
            {"queue": "bound", "exchange": "jobs", "routing_key": "jobs.bound"},
            "bound",
            "",
            id="direct-exchange",
        ),
    ],
)
def test_a_published_message_is_found_in_its_queue(
    app: Celery,
    test_env: SessionEnv,
    redis_client: redis.Redis,
    task: str,
    options: dict[str, Any],
    queue: str,
    key_suffix: str,
) -> None:
    """A published message is found in the queue it went to. Finding 4 of issue 15."""
    # The direct exchange routes only through the queue's binding: declared here, on a
    # connection of its own, so that this test does not depend on what kombu remembers
    # declaring before (the fixture deletes the session's keys, bindings included; the
    # message was once found routed nowhere when the tests ran on two processes).
    with app.connection_for_write() as conn:
        for declared in app.conf.task_queues:
            declared(conn.default_channel).declare()
    task_id = publish(app, task, **options)

    assert queue_of(app, task, options) == queue
    # Where send_task really put it: the queue's list for the message's priority.
    key = f"{test_env.broker_key_prefix}{queue}{key_suffix}"
    assert redis_client.llen(key) == 1
    assert held_task_ids(app, [queue], [task_id, str(uuid.uuid4())]) == {task_id}
    assert held_task_ids(app, ["elsewhere"], [task_id]) == set()


# Celery 5 still honours a task's own queue (deprecated for Celery 6).
@pytest.mark.filterwarnings("ignore::celery.exceptions.CDeprecationWarning")
def test_queue_of_uses_the_options_of_a_registered_task(
    app: Celery, test_env: SessionEnv, redis_client: redis.Redis
) -> None:
    """queue_of uses the options of a registered task. Finding 4 of issue 15."""

    @app.task(name="tasks.pinned", queue="pinned", shared=False)
    def pinned() -> None: ...

    app.finalize()  # as a worker or beat does before it publishes
    task_id = publish(app, "tasks.pinned")

    assert queue_of(app, "tasks.pinned", {}) == "pinned"
    assert redis_client.llen(f"{test_env.broker_key_prefix}pinned") == 1
    assert held_task_ids(app, ["pinned"], [task_id]) == {task_id}
    assert queue_of(app, "tasks.pinned", {"queue": "named"}) == "named"


def test_queue_of_is_none_for_routes_it_cannot_resolve(app: Celery) -> None:
    """queue_of is None for routes it cannot resolve. Finding 4 of issue 15."""
    topic = {"exchange": "events", "exchange_type": "topic", "routing_key": "a.b"}
    assert queue_of(app, TASK, topic) is None
    assert queue_of(app, TASK, {"exchange": "jobs", "routing_key": "unbound"}) is None


def test_a_message_held_by_a_consumer_is_found(
    app: Celery, test_env: SessionEnv, redis_client: redis.Redis
) -> None:
    """A message held by a consumer (in the unacked hash) is found. Finding 4 of issue 15."""
    taken, waiting = publish(app), publish(app)  # the consumer takes the oldest
    received: list[Message] = []

    with (
        app.connection_for_write() as connection,
        # A worker's way with acks_late and a prefetch of 1: BRPOP one message and
        # keep it in the unacked hash until the task is done.
        Consumer(
            connection,
            queues=[Queue("celery")],
            callbacks=[lambda _body, message: received.append(message)],
            accept=["json"],
            prefetch_count=1,
        ),
    ):
        connection.drain_events(timeout=5)
        assert [message.headers["id"] for message in received] == [taken]
        assert redis_client.llen(f"{test_env.broker_key_prefix}celery") == 1
        assert redis_client.hlen(f"{test_env.broker_key_prefix}unacked") == 1

        assert held_task_ids(app, ["celery"], [waiting, taken]) == {waiting, taken}


def test_messages_the_broker_lost_are_reported_missing(
    app: Celery, test_env: SessionEnv, redis_client: redis.Redis
) -> None:
    """Messages the broker lost are reported missing. Finding 4 of issue 15."""
    prefix = test_env.broker_key_prefix
    kept = [publish(app) for _ in range(3)]
    removed = publish(app)
    evicted = [publish(app, priority=9) for _ in range(2)]
    popped = publish(app, queue="other")
    [raw] = [
        item
        for item in redis_client.lrange(f"{prefix}celery", 0, -1)
        if removed.encode() in item  # type: ignore[union-attr]
    ]
    redis_client.lrem(f"{prefix}celery", 1, raw)
    redis_client.delete(f"{prefix}celery\x06\x169")  # as after a restart without persistence
    # Popped by a worker that died before recording it: in neither place, and
    # reported missing (as it is for a moment when the worker lives on).
    redis_client.rpop(f"{prefix}other")

    held = held_task_ids(app, ["celery", "other"], [*kept, removed, *evicted, popped])

    assert held == set(kept)


def test_queue_keys_follow_the_transport_options(
    test_env: SessionEnv, redis_client: redis.Redis
) -> None:
    """Queue keys follow the transport options. Finding 4 of issue 15."""
    app = create_app(test_env.settings())
    app.conf.broker_transport_options = {
        **app.conf.broker_transport_options,
        "sep": ":",
        "priority_steps": list(range(10)),
    }
    task_id = publish(app, priority=7)

    assert redis_client.llen(f"{test_env.broker_key_prefix}celery:7") == 1
    assert held_task_ids(app, ["celery"], [task_id]) == {task_id}
    app.close()


def test_long_queues_and_the_unacked_hash_are_read_in_pages(
    app: Celery, redis_client: redis.Redis
) -> None:
    """Long queues and the unacked hash are read in pages. Finding 4 of issue 15."""
    published = [publish(app, priority=index % 4 * 3) for index in range(50)]
    with app.connection_for_write() as consumer:
        channel = consumer.default_channel
        taken = [channel.basic_get("celery", no_ack=False).headers["id"] for _ in range(10)]
        missing = [str(uuid.uuid4()) for _ in range(5)]

        held = held_task_ids(app, ["celery"], [*published, *missing], page_size=7)

    assert held == set(published)
    assert set(taken) <= held


def test_a_task_id_with_quotes_is_found(app: Celery) -> None:
    """A task ID with quotes is found. Finding 4 of issue 15."""
    task_id = 'run "1" \\ of schedule'
    app.send_task(TASK, task_id=task_id)

    assert held_task_ids(app, ["celery"], [task_id, "run "]) == {task_id}


def test_a_broker_other_than_redis_is_not_read(test_env: SessionEnv) -> None:
    """A broker other than Redis is not read. Finding 4 of issue 15."""
    # Nothing listens there: connecting would fail (or retry) instead of returning.
    app = create_app(test_env.settings(broker_url=f"amqp://guest@127.0.0.1:{closed_port()}//"))

    assert held_task_ids(app, ["celery"], [str(uuid.uuid4())]) is None
    app.close()


@pytest.mark.skipif(not MEASURE, reason="set HABEAT_MEASURE_BROKER_SCAN=1 to measure")
def test_a_scan_of_a_long_backlog_finds_what_it_holds_and_is_measured(
    app: Celery, test_env: SessionEnv, redis_client: redis.Redis
) -> None:
    """Scanning a long backlog finds what it holds; prints time and peak. Finding 4 of issue 15."""
    backlog, candidates = 100_000, 1_000
    template = real_envelope(app, test_env, redis_client)
    ids = [str(uuid.uuid4()) for _ in range(backlog)]
    fill(redis_client, f"{test_env.broker_key_prefix}celery", template, ids)
    # The reaper's candidates are old runs: the oldest messages, read last from the head.
    # The newest are read first: the scan stops early.
    cases = {
        "all held (oldest)": ids[:candidates],
        "all held (newest)": ids[-candidates:],
        "all missing": [str(uuid.uuid4()) for _ in range(candidates)],
    }

    for label, wanted in cases.items():
        started = time.perf_counter()
        held = held_task_ids(app, ["celery"], wanted)
        elapsed = time.perf_counter() - started
        # Again under tracemalloc, which slows the scan down: for its peak only.
        tracemalloc.start()
        held_task_ids(app, ["celery"], wanted)
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        print(
            f"\nbroker scan, {backlog} messages, {candidates} candidates {label}:"
            f" {elapsed:.2f} s, peak {peak / 2**20:.1f} MiB"
        )
        assert held == (set() if label == "all missing" else set(wanted))


def real_envelope(app: Celery, test_env: SessionEnv, redis_client: redis.Redis) -> bytes:
    """A message as send_task writes it, its task ID replaced by ``{id}``."""
    task_id = publish(app)
    raw = redis_client.rpop(f"{test_env.broker_key_prefix}celery")
    assert isinstance(raw, bytes)
    return raw.replace(b"{", b"{{").replace(b"}", b"}}").replace(task_id.encode(), b"{id}")


def fill(client: redis.Redis, key: str, template: bytes, ids: list[str]) -> None:
    """LPUSH a message per ID, oldest first, as the publisher does."""
    text = template.decode()
    for start in range(0, len(ids), 5000):
        client.lpush(key, *(text.format(id=task_id) for task_id in ids[start : start + 5000]))


def test_a_delivery_older_than_delivered_since_does_not_hold_its_message(
    app: Celery, test_env: SessionEnv, redis_client: redis.Redis
) -> None:
    """A message left in the unacked hash by a consumer that died holds it only as long as
    the caller allows: its ``unacked_index`` score is the time of the delivery.
    Finding chaos seed 1 of issue 15."""
    stranded, recent, waiting = publish(app), publish(app), publish(app)
    index = f"{test_env.broker_key_prefix}unacked_index"
    with app.connection_for_write() as connection:
        channel = connection.default_channel
        tags = {
            message.headers["id"]: message.delivery_tag
            for message in (channel.basic_get("celery", no_ack=False) for _ in range(2))
        }
        assert set(tags) == {stranded, recent}
        redis_client.zadd(index, {tags[stranded]: time.time() - 600})
        wanted = [stranded, recent, waiting]

        assert held_task_ids(app, ["celery"], wanted) == set(wanted), "every delivery counts"
        cutoff = time.time() - 60
        assert held_task_ids(app, ["celery"], wanted, delivered_since=cutoff) == {
            recent,
            waiting,
        }
        # Published again under the same task ID: the copy in the queue holds it.
        app.send_task(TASK, args=[1, 2], task_id=stranded)
        assert held_task_ids(app, ["celery"], wanted, delivered_since=cutoff) == set(wanted)
        channel.do_restore = False
