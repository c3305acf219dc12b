"""The dead-letter list of the poison message guard, on a real Redis broker."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from kombu import Connection

from beat.delivery.poison import DeadLetters, Reason, SetAside
from tests.conftest import SessionEnv

pytestmark = pytest.mark.integration


@pytest.fixture
def channel(test_env: SessionEnv, redis_client: redis.Redis) -> Iterator[Any]:
    options = {"global_keyprefix": test_env.broker_key_prefix}
    with Connection(test_env.redis_url, transport_options=options) as connection:
        yield connection.default_channel


def set_aside(n: int) -> SetAside:
    return SetAside(
        reason=Reason.INVALID_TASK,
        problem="its body is not the (args, kwargs, embed) triple",
        queue="celery",
        task_id=f"task-{n}",
        raw=f'{{"n": {n}}}',
    )


def test_the_list_keeps_the_newest_records_up_to_its_length(
    channel: Any, redis_client: redis.Redis, test_env: SessionEnv
) -> None:
    dead_letters = DeadLetters(channel, "habeat.dead_letter", max_length=2)
    where = [dead_letters.keep(set_aside(n)) for n in range(3)]

    key = test_env.broker_key_prefix + "habeat.dead_letter"  # the broker's prefix applies
    assert where == [f"a copy is kept in Redis list {key!r}"] * 3
    records = [json.loads(item) for item in redis_client.lrange(key, 0, -1)]
    assert [r["task_id"] for r in records] == ["task-2", "task-1"]
    assert records[0] | {"set_aside_at": 0} == {
        "queue": "celery",
        "task_id": "task-2",
        "reason": "invalid_task",
        "problem": "its body is not the (args, kwargs, embed) triple",
        "set_aside_at": 0,
        "message": '{"n": 2}',
    }


def test_a_list_of_length_zero_keeps_nothing(
    channel: Any, redis_client: redis.Redis, test_env: SessionEnv
) -> None:
    assert DeadLetters(channel, "habeat.dead_letter", max_length=0).keep(set_aside(1)) == "dropped"
    assert redis_client.exists(test_env.broker_key_prefix + "habeat.dead_letter") == 0
