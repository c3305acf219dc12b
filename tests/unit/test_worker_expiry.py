"""A run's ``expires`` moved onto a worker's clock for Celery's own check, its instant
kept for ours."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any, cast

from beat.messages import ATTEMPT_HEADER
from beat.run_tracking import (
    EXPIRES_HEADER,
    EXPIRY_MARGIN,
    WorkerClock,
    retime_expiry,
    run_expiry,
)

EXPIRY = datetime(2026, 12, 4, 12, 0, tzinfo=UTC)


class _Clock:
    def __init__(self, ahead: float | None) -> None:
        self._ahead = ahead

    def ahead(self) -> float | None:
        return self._ahead


def clock(ahead: float | None) -> WorkerClock:
    return cast(WorkerClock, _Clock(ahead))


def beat_headers(**headers: Any) -> dict[str, Any]:
    return {ATTEMPT_HEADER: 1, "expires": EXPIRY.isoformat(), **headers}


def test_a_clock_ahead_moves_celerys_expiry_later_and_keeps_the_instant() -> None:
    headers = beat_headers()
    retime_expiry(headers, clock(120.0))
    assert run_expiry(headers) == EXPIRY
    assert datetime.fromisoformat(headers["expires"]) == EXPIRY + timedelta(
        seconds=120 + EXPIRY_MARGIN
    )


def test_a_clock_behind_moves_it_earlier() -> None:
    headers = beat_headers()
    retime_expiry(headers, clock(-120.0))
    assert datetime.fromisoformat(headers["expires"]) == EXPIRY - timedelta(
        seconds=120 - EXPIRY_MARGIN
    )


def test_a_retry_is_retimed_from_the_instant_it_carries_not_from_its_parents_clock() -> None:
    shifted = (EXPIRY + timedelta(seconds=500)).isoformat()
    headers = beat_headers(expires=shifted, **{EXPIRES_HEADER: EXPIRY.isoformat()})
    retime_expiry(headers, clock(0.0))
    assert datetime.fromisoformat(headers["expires"]) == EXPIRY + timedelta(seconds=EXPIRY_MARGIN)


def test_messages_beat_did_not_publish_and_unmeasured_clocks_are_left_alone() -> None:
    other = {"expires": EXPIRY.isoformat()}
    retime_expiry(other, clock(120.0))
    assert other == {"expires": EXPIRY.isoformat()}
    unmeasured = beat_headers()
    retime_expiry(unmeasured, clock(None))
    assert unmeasured == beat_headers()
