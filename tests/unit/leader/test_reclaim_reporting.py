"""What the leader's log says of a run the reaper sends again: the reason is the one
that decided (crash detection, or the lease), so that an operator reading it after a
network partition knows which."""

from __future__ import annotations

import logging
import uuid

import pytest

from beat.leader.reporting import Reporter
from beat.models import RunToPublish
from beat.store.leader.records import Reclaim


def run(name: str) -> RunToPublish:
    return RunToPublish(
        id=uuid.uuid4(),
        task="t",
        args=[],
        kwargs={},
        options={},
        schedule_name=name,
        fire_at=None,
        attempt=1,
    )


def test_a_run_sent_again_names_why_its_worker_was_given_up(
    caplog: pytest.LogCaptureFixture,
) -> None:
    dead, expired = run("crashed"), run("silent")
    with caplog.at_level(logging.WARNING):
        Reporter().reclaimed(Reclaim(runs=[dead, expired], lost=[]), dead=frozenset({dead.id}))

    lines = [record.getMessage() for record in caplog.records]
    assert lines == [
        f"publishing run {dead.id} of schedule crashed again (attempt 2):"
        " its worker process is gone",
        f"publishing run {expired.id} of schedule silent again (attempt 2):"
        " its worker's lease expired",
    ]
