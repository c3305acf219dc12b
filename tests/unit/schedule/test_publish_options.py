"""The publish options a schedule may carry (``beat.schedule.options``)."""

from __future__ import annotations

import pytest
from celery import Celery

from beat.errors import InvalidSchedule
from beat.schedule.options import MAX_HEADERS_BYTES, check_publish_options, reserved_header


def test_every_header_celery_writes_into_a_message_is_reserved() -> None:
    """Whatever this Celery version puts in a message's headers, a schedule cannot set."""
    app = Celery("probe", set_as_current=False)
    message = app.amqp.as_task_v2(
        "0b0e5a1c-0000-4000-8000-000000000000",
        "tasks.x",
        args=[1],
        kwargs={},
        eta="2030-01-01T00:00:00+00:00",
        expires="2030-01-02T00:00:00+00:00",
        group_id="g",
        group_index=0,
        root_id="r",
        parent_id="p",
        stamped_headers=["s"],
        s="stamp",
    )
    written = set(message.headers) | set(message.properties)
    assert written, "the probe message has headers"
    assert [name for name in sorted(written) if not reserved_header(name)] == []


@pytest.mark.parametrize(
    "name", ["task", "TASK", "id", "eta", "shadow", "root_id", "hostname", "delivery_info",
             "is_eager", "habeat_schedule", "habeat_anything", "x-delay", "X-Match", "x_death"],
)  # fmt: skip
def test_names_others_read_are_reserved(name: str) -> None:
    assert reserved_header(name)
    with pytest.raises(InvalidSchedule, match="rename it"):
        check_publish_options({"headers": {name: 1}})


def test_allowed_options_are_kept_as_given() -> None:
    options = {
        "queue": "reports",
        "exchange": "jobs",
        "routing_key": "reports.daily",
        "priority": 0,
        "expires": 30.5,
        "headers": {"tenant": "acme", "trace-id": 7, "ratio": 0.5, "sampled": False, "n": None},
    }
    assert check_publish_options(options) == options
    assert check_publish_options({"expires": "2030-01-01T00:00:00+01:00"})
    assert check_publish_options({"priority": 255, "headers": {}}) == {
        "priority": 255,
        "headers": {},
    }


@pytest.mark.parametrize(
    ("options", "says"),
    [
        ({"headers": {"big": "x" * MAX_HEADERS_BYTES}}, "bytes as JSON"),
        ({"headers": {"n": 2**63}}, "must be a string, number"),
        ({"headers": {"n": float("nan")}}, "must be a string, number"),
        ({"headers": {"t": "a\x00b"}}, "must be a string, number"),
        ({"headers": {"t": "\ud800"}}, "must be a string, number"),
        ({"headers": {1: "one"}}, "must be 1 to 64 letters"),
        ({"headers": {"a" * 65: 1}}, "must be 1 to 64 letters"),
        ({"headers": {"-lead": 1}}, "starting with a letter"),
        ({"routing_key": None}, "options.routing_key must be a name"),
        ({"priority": -1}, "0 to 255"),
        ({"priority": 1.0}, "whole number"),
        ({"expires": float("inf")}, "options.expires"),
        ({"expires": True}, "options.expires"),
        ({"expires": "9999-12-31T23:00:00-12:00"}, "years 1 to 9999"),
        ({"queue": "q", "retry": True}, "unsupported publish option(s) retry"),
        (["queue", "q"], "options must be a JSON object"),
    ],
)
def test_bad_options_are_refused_in_one_line(options: object, says: str) -> None:
    with pytest.raises(InvalidSchedule) as caught:
        check_publish_options(options)
    assert says in str(caught.value)
    assert "\n" not in str(caught.value)
