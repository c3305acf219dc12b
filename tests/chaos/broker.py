"""The broker-message-loss fault: a Redis that lost some of its keys' content.

kombu's Redis transport keeps the messages waiting for a worker in one list per
queue and priority (``celery``, ``celery\\x06\\x163``, ...), and those a worker
took but has not acknowledged in the ``unacked`` hash (delivery tag -> JSON
``[message, exchange, routing key]``) with their times in the ``unacked_index``
sorted set; every key carries the transport's ``global_keyprefix``
(``kombu/transport/redis.py``). The fault deletes a share of both kinds.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from typing import Any

import redis

UNACKED = "unacked"
UNACKED_INDEX = "unacked_index"


@dataclass(frozen=True, kw_only=True, slots=True)
class Deletion:
    task_id: str
    #: ``queue`` or ``unacked``.
    where: str


def task_id_of(message: Any) -> str | None:
    """The Celery task ID of a kombu message (protocol 2 keeps it in the headers)."""
    if not isinstance(message, dict):
        return None
    headers = message.get("headers") or {}
    task_id = headers.get("id") if headers.get("task") else None
    return task_id if isinstance(task_id, str) else None


def delete_messages(client: redis.Redis, prefix: str, share: float, seed: str) -> list[Deletion]:
    """Delete about ``share`` of the task messages waiting in queue lists and held in the
    unacked hash under ``prefix``; the ones really deleted (a worker may take one first)."""
    rng = random.Random(seed)
    deleted = _delete_from_queues(client, prefix, share, rng)
    deleted += _delete_unacked(client, prefix, share, rng)
    return deleted


def _delete_from_queues(
    client: redis.Redis, prefix: str, share: float, rng: random.Random
) -> list[Deletion]:
    deleted = []
    # Lists only, chosen by the server: the result backend keeps a key per task under the
    # same prefix (the workflows' chords need one), and asking each key's type would
    # keep the stopped workers stopped past the fault's duration.
    keys = client.scan_iter(match=f"{prefix}*".encode(), count=1000, _type="list")
    for key in sorted(keys):
        raws: list[bytes] = client.lrange(key, 0, -1)  # type: ignore[assignment]
        for raw in raws:
            task_id = task_id_of(_json(raw))
            if task_id is None or rng.random() >= share:
                continue
            if client.lrem(key, 1, raw):  # type: ignore[arg-type]  # bytes work as well
                deleted.append(Deletion(task_id=task_id, where="queue"))
    return deleted


def _delete_unacked(
    client: redis.Redis, prefix: str, share: float, rng: random.Random
) -> list[Deletion]:
    deleted = []
    entries: dict[bytes, bytes] = client.hgetall(f"{prefix}{UNACKED}")  # type: ignore[assignment]
    for tag, raw in sorted(entries.items()):
        payload = _json(raw)
        task_id = task_id_of(payload[0]) if isinstance(payload, list) and payload else None
        if task_id is None or rng.random() >= share:
            continue
        if client.hdel(f"{prefix}{UNACKED}", tag):
            client.zrem(f"{prefix}{UNACKED_INDEX}", tag)
            deleted.append(Deletion(task_id=task_id, where="unacked"))
    return deleted


def _json(raw: bytes) -> Any:
    try:
        return json.loads(raw)
    except ValueError:
        return None
