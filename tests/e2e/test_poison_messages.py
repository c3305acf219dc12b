"""Malformed broker messages pushed straight into a real worker's Redis queue:
each is set aside once (removed, logged, counted, kept in the dead-letter list),
and the worker goes on with the next valid message."""

from __future__ import annotations

import base64
import json
import uuid
from dataclasses import dataclass

import pytest
import redis

from tests.conftest import SessionEnv
from tests.e2e.cluster import Cluster, Process, wait_until
from tests.e2e.test_metrics import free_port, value

pytestmark = pytest.mark.e2e

QUEUE = "celery"
DEAD_LETTER = "habeat.dead_letter"


@dataclass(frozen=True)
class Malformed:
    name: str
    item: str  # the Redis list item, as kombu would have stored a message
    task_id: str | None  # what the ERROR line must name
    reason: str


def envelope(
    body: bytes,
    headers: dict[str, object] | None,
    task_id: str,
    content_type: str = "application/json",
    content_encoding: str = "utf-8",
) -> str:
    """A kombu Redis envelope, as ``kombu.transport.redis`` stores messages."""
    return json.dumps(
        {
            "body": base64.b64encode(body).decode(),
            "content-encoding": content_encoding,
            "content-type": content_type,
            "headers": headers,
            "properties": {
                "correlation_id": task_id,
                "reply_to": "",
                "delivery_mode": 2,
                "delivery_info": {"exchange": "", "routing_key": QUEUE},
                "priority": 0,
                "body_encoding": "base64",
                "delivery_tag": str(uuid.uuid4()),
            },
        }
    )


def task_headers(task_id: str, task: str = "e2e.record") -> dict[str, object]:
    return {
        "lang": "py",
        "task": task,
        "id": task_id,
        "root_id": task_id,
        "parent_id": None,
        "group": None,
        "retries": 0,
        "timelimit": [None, None],
        "eta": None,
        "expires": None,
        "argsrepr": "",
        "kwargsrepr": "",
        "origin": "test",
    }


def task_message(name: str, body: bytes, reason: str, **options: str) -> Malformed:
    task_id = str(uuid.uuid4())
    headers = task_headers(task_id, options.pop("task", "e2e.record"))
    return Malformed(name, envelope(body, headers, task_id, **options), task_id, reason)


def malformed_messages() -> list[Malformed]:
    no_headers_id = str(uuid.uuid4())
    return [
        # Celery 5.7 dies on this one and restores it: every worker in turn.
        task_message("body not the task triple", b'{"x": 1}', "invalid_task"),
        Malformed(
            "body without task headers",
            envelope(b'{"x": 1}', {}, no_headers_id),
            no_headers_id,
            "not_a_task",
        ),
        task_message("body not JSON", b"{not json", "undecodable"),
        task_message(
            "pickle body, only JSON accepted",
            b"\x80\x04K\x01.",
            "disallowed_content",
            content_type="application/x-python-serialize",
            content_encoding="binary",
        ),
        task_message("unknown task", b"[[], {}, {}]", "unknown_task", task="no.such.task"),
        Malformed("list item not JSON", "this is not json", None, "not_an_envelope"),
        Malformed("JSON but no envelope", '{"hello": "world"}', None, "not_an_envelope"),
    ]


def start_worker(cluster: Cluster, pool: str, metrics_port: int) -> Process:
    process = cluster.worker(
        "worker1", concurrency=1, pool=pool, HABEAT_WORKER_METRICS_PORT=str(metrics_port)
    )
    wait_until(lambda: " ready." in process.output() or not process.alive(), timeout=60)
    return process


def error_lines(process: Process) -> list[str]:
    return [line for line in process.output().splitlines() if "ERROR/" in line]


def send_after_each(
    cluster: Cluster, client: redis.Redis, env: SessionEnv, messages: list[Malformed]
) -> list[str]:
    """Push each malformed message, then a valid task, on the same queue; the valid IDs."""
    app = cluster.app()
    valid = []
    for message in messages:
        client.lpush(env.broker_key_prefix + QUEUE, message.item)
        task_id = str(uuid.uuid4())
        app.send_task("e2e.record", args=[f"after {message.name}"], task_id=task_id, queue=QUEUE)
        valid.append(task_id)
    return valid


def normalized(item: str) -> str:
    try:
        return json.dumps(json.loads(item), sort_keys=True)
    except ValueError:
        return item


def assert_set_aside(
    process: Process, client: redis.Redis, env: SessionEnv, messages: list[Malformed]
) -> None:
    assert client.llen(env.broker_key_prefix + QUEUE) == 0, "nothing is left in the queue"
    # The last valid run's effect commits before its message is acknowledged (acks_late):
    # the ack follows within moments.
    wait_until(lambda: client.hlen(env.broker_key_prefix + "unacked") == 0, timeout=10)
    errors = error_lines(process)
    print("\n".join(errors))
    for message in messages:
        lines = [line for line in errors if f"({message.reason})" in line]
        if message.task_id is not None:
            lines = [line for line in lines if message.task_id in line]
        assert lines, f"no ERROR line for {message.name}"
        assert f"from queue {QUEUE!r}" in lines[0]
    assert len(errors) == len(messages), "one ERROR line per message"
    kept = [
        json.loads(record) for record in client.lrange(env.broker_key_prefix + DEAD_LETTER, 0, -1)
    ]
    assert sorted(record["reason"] for record in kept) == sorted(m.reason for m in messages)
    # Each copy is the message as the broker stored it: it can be fixed and sent again.
    assert sorted(normalized(record["message"]) for record in kept) == sorted(
        normalized(m.item) for m in messages
    )
    assert {record["queue"] for record in kept} == {QUEUE}


def test_malformed_messages_are_set_aside_and_the_worker_goes_on(
    cluster: Cluster, redis_client: redis.Redis, test_env: SessionEnv
) -> None:
    """Malformed messages are set aside and a threads worker goes on. Finding 16 of issue 15."""
    port = free_port()
    worker = start_worker(cluster, "threads", port)
    messages = malformed_messages()
    valid = send_after_each(cluster, redis_client, test_env, messages)

    wait_until(lambda: not worker.alive() or len(cluster.effects()) == len(valid), timeout=90)
    assert worker.alive(), "a malformed message killed the worker"
    assert cluster.effects() == dict.fromkeys(valid, 1), "every valid task after one ran once"
    assert_set_aside(worker, redis_client, test_env, messages)
    for reason in {m.reason for m in messages}:
        expected = sum(m.reason == reason for m in messages)
        counted = value(port, "habeat_worker_messages_set_aside_total", reason=reason)
        assert counted == expected, reason


def test_a_prefork_worker_survives_a_body_that_is_not_the_task_triple(
    cluster: Cluster, redis_client: redis.Redis, test_env: SessionEnv
) -> None:
    """A prefork worker survives a body that is not the task triple. Finding 16 of issue 15."""
    worker = start_worker(cluster, "prefork", free_port())
    messages = malformed_messages()[:1]
    valid = send_after_each(cluster, redis_client, test_env, messages)

    wait_until(lambda: not worker.alive() or len(cluster.effects()) == len(valid), timeout=90)
    assert worker.alive(), "a malformed message killed the worker"
    assert cluster.effects() == dict.fromkeys(valid, 1)
    assert_set_aside(worker, redis_client, test_env, messages)
