"""The pure rules of beat presence: refreshes throttled, failures logged once a streak,
entries read back, the leader listed first."""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import redis

from beat.lease.presence import BeatPresence, BeatProcess, beats_from_entries, leader_first

T0 = datetime(2030, 1, 1, tzinfo=UTC)


class FakeRedis:
    """Runs no script: records the calls of the one registered, failing on demand."""

    def __init__(self) -> None:
        self.calls: list[list[Any]] = []
        self.failing = False

    def register_script(self, script: str) -> Any:
        def run(*, keys: list[str], args: list[Any]) -> int:
            self.calls.append(args)
            if self.failing:
                raise redis.ConnectionError("Connection refused")
            return 0

        return run


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def presence(client: FakeRedis, clock: Clock) -> BeatPresence:
    return BeatPresence(
        client,  # type: ignore[arg-type]
        prefix="p",
        holder="me",
        lifetime=25.0,
        interval=3.0,
        clock=clock,
    )


def test_a_refresh_goes_out_at_most_once_per_interval() -> None:
    client, clock = FakeRedis(), Clock()
    mine = presence(client, clock)
    for now in (0.0, 1.0, 2.9, 3.0, 5.0, 6.5):
        clock.now = now
        mine.refresh()
    assert len(client.calls) == 3, "at 0, 3 and 6.5 s"
    holder, lifetime_ms, info = client.calls[0]
    assert (holder, lifetime_ms) == ("me", 25_000)
    assert json.loads(info)["lifetime_ms"] == 25_000


def test_failed_refreshes_are_retried_per_interval_and_logged_once_a_streak(
    caplog: pytest.LogCaptureFixture,
) -> None:
    client, clock = FakeRedis(), Clock()
    mine = presence(client, clock)
    caplog.set_level(logging.DEBUG, logger="beat.lease.presence")
    client.failing = True
    for now in (0.0, 1.0, 3.0, 6.0):
        clock.now = now
        mine.refresh()  # never raises
    assert len(client.calls) == 3, "a failed attempt waits its interval too"
    assert len(caplog.records) == 1
    client.failing = False
    clock.now = 9.0
    mine.refresh()
    client.failing = True
    clock.now = 12.0
    mine.refresh()
    assert len(caplog.records) == 2, "a new streak is logged again"


def test_entries_are_read_back_and_unreadable_ones_left_out() -> None:
    info = {"host": "h", "pid": 7, "started_at": T0.isoformat(), "lifetime_ms": 25_000}
    expires_ms = int((T0 + timedelta(minutes=1)).timestamp() * 1000)
    live = [b"a", str(expires_ms).encode(), b"b", b"1", b"c", b"2"]
    infos = [json.dumps(info).encode(), None, b"not json"]

    [found] = beats_from_entries(live, infos)

    assert found == BeatProcess(
        holder="a",
        host="h",
        pid=7,
        started_at=T0,
        seen_at=T0 + timedelta(seconds=35),
        expires_at=T0 + timedelta(minutes=1),
        version=None,
    )


def test_the_leader_comes_first_then_the_others_by_start() -> None:
    def beat(holder: str, started_minutes: int) -> BeatProcess:
        started = T0 + timedelta(minutes=started_minutes)
        return BeatProcess(
            holder=holder, host="h", pid=1, started_at=started, seen_at=started, expires_at=started
        )

    beats = [beat("late", 3), beat("leader", 2), beat("early", 1)]
    assert [b.holder for b in leader_first(beats, "leader")] == ["leader", "early", "late"]
    assert [b.holder for b in leader_first(beats, None)] == ["early", "leader", "late"]
