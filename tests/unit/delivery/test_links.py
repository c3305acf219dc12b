"""A run's links: which requests have them, what is kept of their result, and the task
IDs they are sent under (the same at every send)."""

from __future__ import annotations

import uuid
from types import SimpleNamespace
from typing import Any

import pytest
from celery import Celery
from celery.canvas import Signature

from beat.delivery.links import forget_links, has_links, links_record, send_links


def request(**fields: Any) -> SimpleNamespace:
    values: dict[str, Any] = {
        "id": str(uuid.uuid4()),
        "root_id": None,
        "callbacks": None,
        "chain": None,
        "delivery_info": {"priority": 3},
    }
    return SimpleNamespace(**(values | fields))


@pytest.fixture
def sent(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, Any, dict[str, Any]]]:
    calls: list[tuple[str, Any, dict[str, Any]]] = []

    def apply_async(self: Signature, args: Any = None, **options: Any) -> None:
        calls.append((self.task, args, {"task_id": self.options.get("task_id"), **options}))

    monkeypatch.setattr(Signature, "apply_async", apply_async)
    return calls


def test_only_a_request_with_callbacks_or_a_chain_has_links() -> None:
    assert not has_links(request())
    assert not has_links(request(callbacks=[], chain=[]))
    assert has_links(request(chain=[{"task": "t"}]))
    assert has_links(request(callbacks=[{"task": "t"}]))


def test_a_result_json_cannot_hold_is_left_to_celerys_tracer() -> None:
    assert links_record({"a": [1, "b"]}) == {"result": {"a": [1, "b"]}}
    assert links_record(object()) is None
    assert links_record(float("nan")) is not None  # JSON as Python writes it


def test_callbacks_without_a_task_id_get_the_same_one_at_every_send(
    sent: list[tuple[str, Any, dict[str, Any]]],
) -> None:
    app = Celery(set_as_current=False)
    delivery = request(
        callbacks=[dict(Signature("cb.one", app=app)), dict(Signature("cb.two", app=app))]
    )
    send_links(app, delivery, 7)
    first = [options["task_id"] for _, _, options in sent]
    sent.clear()
    send_links(app, delivery, 7)
    assert [options["task_id"] for _, _, options in sent] == first
    assert len(set(first)) == 2
    assert all(task_id for task_id in first)


def test_the_chain_goes_on_with_the_result_its_ids_and_its_lineage(
    sent: list[tuple[str, Any, dict[str, Any]]],
) -> None:
    app = Celery(set_as_current=False)
    app.conf.task_inherit_parent_priority = True
    third = Signature("chain.third", app=app, options={"task_id": "id-3"})
    second = Signature("chain.second", app=app, options={"task_id": "id-2"})
    delivery = request(chain=[dict(third), dict(second)], root_id="root")
    send_links(app, delivery, {"rows": 2})
    assert sent == [
        (
            "chain.second",
            ({"rows": 2},),
            {
                "task_id": "id-2",
                "chain": [dict(third)],
                "parent_id": delivery.id,
                "root_id": "root",
                "priority": 3,
            },
        )
    ]


def test_forgotten_links_leave_celerys_tracer_nothing_to_send() -> None:
    delivery = request(callbacks=[{"task": "t"}], chain=[{"task": "u"}])
    forget_links(delivery)
    assert not has_links(delivery)
