"""Lost-message recovery's decision about consumers that do not record runs
(``beat.leader.lost_messages``), on a fake store and a fake broker."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from celery import Celery

from beat.leader import lost_messages
from beat.leader.lost_messages import LostMessages
from beat.models import RunToPublish
from beat.publish.inventory import Holdings
from beat.store.leader import Reclaim, Unconfirmed, UnrecordedConsumer, WorkerPresence

NOW = datetime(2026, 12, 5, 12, 0, tzinfo=UTC)


def consumer(queue: str, *, gone_at: datetime | None = None) -> UnrecordedConsumer:
    return UnrecordedConsumer(
        queue=queue,
        consumer="celery@old-image",
        first_seen_at=NOW - timedelta(hours=1),
        seen_at=NOW,
        gone_at=gone_at,
    )


def test_a_node_missing_from_beat_workers_is_an_unrecorded_consumer_of_its_queues() -> None:
    replies = {"w1@a": ["celery"], "celery@old-image": ["celery", "reports"]}

    found = lost_messages.unrecorded_pairs(replies, {"w1@a"})

    assert found == [("celery", "celery@old-image"), ("reports", "celery@old-image")]
    assert lost_messages.unrecorded_pairs(replies, {"w1@a", "celery@old-image"}) == []


def test_no_reply_at_all_is_a_finding_about_every_queue_if_some_worker_records_runs() -> None:
    assert lost_messages.unrecorded_pairs(None, {"w1@a"}) == [("*", "")]
    assert lost_messages.unrecorded_pairs(None, set()) == [], "no worker is known to consume"


def test_a_run_of_a_queue_with_an_unrecorded_consumer_is_not_sent_again() -> None:
    published = NOW - timedelta(minutes=5)
    may = lost_messages.may_send_again

    assert may("celery", published, [])
    assert may("celery", published, [consumer("reports")])
    assert not may("celery", published, [consumer("celery")]), "still consuming"
    assert not may("celery", published, [consumer("celery", gone_at=NOW)]), "may still hold it"
    assert not may("celery", None, []), "publication not recorded: no proof"


@dataclass
class FakeStore:
    """The part of ``LeaderStore`` that lost-message recovery uses, in memory."""

    runs: list[RunToPublish]
    recording: list[str] = field(default_factory=list)
    found: list[UnrecordedConsumer] = field(default_factory=list)
    requeued: list[uuid.UUID] = field(default_factory=list)

    def unconfirmed_runs(self, *, older_than: float, limit: int) -> Unconfirmed:
        published = dict.fromkeys((run.id for run in self.runs), NOW - timedelta(minutes=1))
        return Unconfirmed(runs=self.runs, now=NOW, published_at=published)

    def expire_runs(self, epoch: int, run_ids: Sequence[uuid.UUID], **_: Any) -> int:
        return 0

    def requeue_missing(self, epoch: int, run_ids: Sequence[uuid.UUID], **_: Any) -> Reclaim:
        self.requeued.extend(run_ids)
        return Reclaim(runs=[run for run in self.runs if run.id in run_ids], lost=[])

    def live_workers(self, *, within: timedelta) -> list[WorkerPresence]:
        return [
            WorkerPresence(name=name, pid=1, booted_at=NOW, seen_at=NOW) for name in self.recording
        ]

    def record_consumers(
        self, epoch: int, found: Sequence[tuple[str, str]], **_: Any
    ) -> list[UnrecordedConsumer]:
        self.found = [
            UnrecordedConsumer(
                queue=queue, consumer=node, first_seen_at=NOW, seen_at=NOW, gone_at=None
            )
            for queue, node in found
        ]
        return self.found

    def unrecorded_consumers(self) -> list[UnrecordedConsumer]:
        return self.found


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def run() -> RunToPublish:
    return RunToPublish(
        id=uuid.uuid4(),
        task="jobs.plain",
        args=[],
        kwargs={},
        options={},
        schedule_name="every-20s",
        fire_at=NOW - timedelta(minutes=1),
        attempt=0,
    )


def looks(
    store: FakeStore, replies: dict[str, list[str]] | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Three looks of the leader, far enough apart to confirm a missing message; the
    broker holds no message, the workers answer ``replies``."""
    nothing_held = Holdings(waiting=set(), delivered={})
    monkeypatch.setattr(lost_messages, "broker_holdings", lambda *_, **__: nothing_held)
    monkeypatch.setattr(lost_messages, "active_queues", lambda *_, **__: replies, raising=False)
    now_thread: Callable[[Callable[[], None]], None] = lambda check: check()  # noqa: E731
    monkeypatch.setattr(lost_messages, "_start_thread", now_thread, raising=False)
    app = Celery("t")
    app.conf.habeat_database_url = "postgresql+psycopg://nobody@127.0.0.1:1/x"
    app.conf.habeat_redis_url = "redis://127.0.0.1:1/0"
    clock = Clock()
    recovery = LostMessages(app, clock=clock)
    for _ in range(3):
        recovery.look(store, 1, limit=10, idle_timeout=1)  # type: ignore[arg-type]
        clock.now += lost_messages.CHECK_INTERVAL


def test_issue_38_finding_1_a_queue_with_a_foreign_consumer_gets_no_copy(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """issue 38, finding 1: the queue ``celery`` is consumed by ``celery@old-image``,
    which is not in ``beat_workers`` (a worker without this package): a run of that
    queue that no worker recorded, its message not in the broker, is not sent again."""
    store = FakeStore(runs=[run()], recording=["w1@a"])

    looks(store, {"w1@a": ["celery"], "celery@old-image": ["celery"]}, monkeypatch)

    assert store.requeued == []


def test_a_queue_whose_every_consumer_records_runs_gets_its_lost_message_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    lost = run()
    store = FakeStore(runs=[lost], recording=["w1@a"])

    looks(store, {"w1@a": ["celery"], "celery@old-image": ["reports"]}, monkeypatch)

    assert store.requeued == [lost.id]


def test_a_check_nobody_answered_decides_no_copy_while_workers_record_runs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The broker restarting, or the control turned off: workers that record runs do not
    answer. Such a check says nothing about who took a message: nothing is sent again."""
    store = FakeStore(runs=[run()], recording=["w1@a"])

    looks(store, None, monkeypatch)

    assert store.requeued == []
    assert [(entry.queue, entry.consumer) for entry in store.found] == [("*", "")]


def test_with_no_worker_at_all_a_lost_message_is_sent_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    lost = run()
    store = FakeStore(runs=[lost])

    looks(store, None, monkeypatch)

    assert store.requeued == [lost.id]
