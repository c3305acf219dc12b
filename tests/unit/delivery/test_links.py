"""A run's links: which requests have them, what is kept of their result, and the task
IDs they are sent under (the same at every send)."""

from __future__ import annotations

import uuid
from types import SimpleNamespace
from typing import Any

import pytest
from celery import Celery, states
from celery.canvas import Signature
from celery.exceptions import Reject
from kombu.exceptions import OperationalError

from beat.delivery.links import (
    forget_links,
    has_links,
    links_record,
    send_links,
    send_links_after_completion,
    send_links_left_unsent,
)
from beat.store.run_links import UnsentLinks
from beat.store.runs import run_id_for


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


@pytest.mark.parametrize(
    "result",
    [object(), float("nan"), {"x": [float("inf")]}, "a\x00b", {"k": ["\x00"]}],
    ids=["not-json", "nan", "infinity", "nul", "nested-nul"],
)
def test_a_result_postgresql_cannot_keep_is_left_to_celerys_tracer(result: Any) -> None:
    # PostgreSQL's JSONB refuses NaN, infinities and NUL: the completion must not fail.
    assert links_record(result) is None


def test_a_json_result_is_kept_for_the_links() -> None:
    assert links_record({"a": [1, "b", 2.5, None]}) == {"result": {"a": [1, "b", 2.5, None]}}


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


class LinksStore:
    def __init__(self) -> None:
        self.sent: list[uuid.UUID] = []

    def links_sent(self, run_id: uuid.UUID) -> None:
        self.sent.append(run_id)


@pytest.mark.parametrize(
    ("error", "raised", "kept"),
    [
        # The broker cannot take them now: the message goes back, they are kept.
        (OperationalError("connection refused"), Reject, True),
        # A signature that does not fit its task (Celery's strict typing): every send
        # raises, so the task fails as Celery fails it, and nothing tries it again.
        (TypeError("takes 0 positional arguments but 1 was given"), TypeError, False),
    ],
    ids=["broker-unavailable", "never-sendable"],
)
def test_a_failed_send_of_the_links_is_tried_again_only_if_the_broker_was_the_cause(
    monkeypatch: pytest.MonkeyPatch, error: Exception, raised: type[Exception], kept: bool
) -> None:
    def apply_async(self: Signature, args: Any = None, **options: Any) -> None:
        raise error

    monkeypatch.setattr(Signature, "apply_async", apply_async)
    app = Celery(set_as_current=False, broker="memory://")
    store = LinksStore()
    delivery = request(chain=[dict(Signature("chain.next", app=app))])
    with pytest.raises(raised):
        send_links_after_completion(app, delivery, store, 1)  # type: ignore[arg-type]
    assert store.sent == ([] if kept else [run_id_for(delivery.id)])
    assert not has_links(delivery), "Celery's tracer sends nothing"


class SettledStore(LinksStore):
    def unsent_links(self, run_id: uuid.UUID, *, settle_seconds: float) -> UnsentLinks:
        return UnsentLinks(result={"rows": 5}, settled=True)


def test_links_sent_by_a_second_delivery_store_the_result_the_first_did_not(
    sent: list[tuple[str, Any, dict[str, Any]]],
) -> None:
    # The first delivery handed its message back before Celery stored its result: a
    # result backend (and a chord the run belongs to) must still learn it succeeded.
    app = Celery(set_as_current=False, broker="memory://", backend="cache+memory://")
    delivery = request(
        chain=[dict(Signature("chain.next", app=app))], chord=None, group=None, ignore_result=False
    )
    store = SettledStore()
    run_id = uuid.uuid4()

    send_links_left_unsent(app, delivery, store, run_id, settle_seconds=0)  # type: ignore[arg-type]

    assert [task for task, _, _ in sent] == ["chain.next"]
    assert store.sent == [run_id]
    assert app.backend.get_state(delivery.id) == states.SUCCESS
    assert app.backend.get_result(delivery.id) == {"rows": 5}


class NothingUnsentStore(LinksStore):
    def unsent_links(self, run_id: uuid.UUID, *, settle_seconds: float) -> None:
        return None


def test_a_second_delivery_with_nothing_left_unsent_opens_no_broker_connection(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    app = Celery(set_as_current=False, broker="memory://")
    opened: list[object] = []
    connection_for_write = app.connection_for_write

    def counted(*args: Any, **kwargs: Any) -> Any:
        opened.append(args)
        return connection_for_write(*args, **kwargs)

    monkeypatch.setattr(app, "connection_for_write", counted)
    delivery = request(chain=[dict(Signature("chain.next", app=app))])

    send_links_left_unsent(app, delivery, NothingUnsentStore(), uuid.uuid4(), settle_seconds=0)  # type: ignore[arg-type]

    assert opened == [], "the broker's errors are built only when a send failed"
