"""Finding task IDs in raw broker envelopes (finding 4), without a broker."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from beat.publish.inventory import _find, _task_ids


def envelope(task_id: str, **headers: Any) -> bytes:
    """A kombu Redis envelope as kombu writes it (JSON, body in base64)."""
    message = {
        "body": "W1sxLCAyXSwge30sIHt9XQ==",
        "headers": {"lang": "py", "task": "tasks.demo.add", "id": task_id, **headers},
        "properties": {"correlation_id": task_id, "body_encoding": "base64"},
    }
    return json.dumps(message).encode()


def unacked_entry(task_id: str) -> bytes:
    """A value of kombu's unacked hash: [message, exchange, routing_key]."""
    return json.dumps([json.loads(envelope(task_id)), "", "celery"]).encode()


def test_task_ids_are_read_from_envelopes_and_unacked_entries() -> None:
    """Task IDs are read from envelopes and unacked entries. Finding 4 of issue 15."""
    page = [envelope("a"), unacked_entry("b"), envelope('with "quotes" and \\')]

    assert set(_task_ids(page)) == {"a", "b", 'with "quotes" and \\'}


def test_ids_quoted_inside_header_values_are_not_task_ids() -> None:
    """IDs quoted inside header values are not task IDs. Finding 4 of issue 15."""
    page = [envelope("a", argsrepr='{"id": "not-a-task"}', kwargsrepr="{'id': 'x'}")]

    assert set(_task_ids(page)) == {"a"}


def test_reading_stops_once_every_id_is_found() -> None:
    """Reading stops once every ID is found. Finding 4 of issue 15."""

    def pages() -> Iterator[list[bytes]]:
        yield [envelope("a"), envelope("other")]
        yield [unacked_entry("b")]
        raise AssertionError("read a page after every ID was found")

    assert _find({"a", "b"}, pages()) == {"a", "b"}


def test_ids_never_seen_are_left_out() -> None:
    """IDs never seen are left out. Finding 4 of issue 15."""
    assert _find({"a", "gone"}, iter([[envelope("a")], []])) == {"a"}
