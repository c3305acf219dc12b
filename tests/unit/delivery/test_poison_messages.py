"""What the poison message guard finds wrong with a Redis list item or a task message."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from typing import Any

import pytest
from kombu import Connection

from beat.delivery.poison import _task_id_of, _unpack_problem, envelope_problem


@pytest.fixture
def channel() -> Iterator[Any]:
    with Connection("memory://") as connection:
        yield connection.default_channel


def envelope(body: bytes, headers: dict[str, Any] | None = None, **properties: Any) -> str:
    return json.dumps(
        {
            "body": base64.b64encode(body).decode(),
            "content-type": "application/json",
            "content-encoding": "utf-8",
            "headers": headers if headers is not None else {"task": "t", "id": "task-1"},
            "properties": {
                "body_encoding": "base64",
                "delivery_tag": "tag-1",
                "delivery_info": {"exchange": "", "routing_key": "celery"},
                **properties,
            },
        }
    )


def message(channel: Any, item: str) -> Any:
    return channel.Message(json.loads(item), channel=channel)


def test_a_kombu_envelope_has_nothing_wrong(channel: Any) -> None:
    assert envelope_problem(channel, envelope(b"[[], {}, {}]").encode()) is None


@pytest.mark.parametrize(
    ("item", "problem"),
    [
        (b"this is not json", "not JSON"),
        (b"\xff\xfe", "not JSON"),
        (b"[1, 2]", "a JSON list, not an object"),
        (b'{"x": 1}', "KeyError: 'properties'"),
        (envelope(b"[]", body_encoding="base64", delivery_tag=None).encode(), "delivery_tag"),
        (
            envelope(b"[]", delivery_info={"exchange": ""}).encode(),
            "no delivery_info with exchange and routing_key",
        ),
        (json.dumps({"body": "%%%", "properties": {"body_encoding": "base64"}}).encode(), "Error"),
    ],
)
def test_an_item_kombu_cannot_deliver_is_not_a_kombu_message(
    channel: Any, item: bytes, problem: str
) -> None:
    found = envelope_problem(channel, item)
    assert found is not None
    assert found.startswith("not a kombu message")
    assert problem in found


@pytest.mark.parametrize(
    "body", [b'{"x": 1}', b"[1, 2]", b"[1, {}, {}]", b"[[], [], {}]", b"[[], {}, 5]"]
)
def test_a_task_body_that_is_not_the_protocol_2_triple_says_so(channel: Any, body: bytes) -> None:
    problem = _unpack_problem(message(channel, envelope(body)))
    assert problem is not None
    assert "not the (args, kwargs, embed) triple" in problem


def test_a_protocol_2_triple_unpacks(channel: Any) -> None:
    assert _unpack_problem(message(channel, envelope(b'[[1], {"a": 2}, {}]'))) is None
    assert _unpack_problem(message(channel, envelope(b"[[1], {}, null]"))) is None


def test_the_task_id_comes_from_the_headers_or_else_the_correlation_id(channel: Any) -> None:
    assert _task_id_of(message(channel, envelope(b"[]"))) == "task-1"
    no_headers = envelope(b"{}", headers={}, correlation_id="corr-1")
    assert _task_id_of(message(channel, no_headers)) == "corr-1"
