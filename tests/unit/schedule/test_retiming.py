"""The next fire time of a schedule whose timing changed (a deploy, an update)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from beat.schedule.define import define
from beat.store.code_sync import next_fire_after_retiming

NOW = datetime(2026, 12, 3, 12, 0, tzinfo=UTC)
MISSED = NOW - timedelta(minutes=7)
RECOMPUTED = NOW + timedelta(minutes=3)


@pytest.mark.parametrize(
    ("current", "window", "expected"),
    [
        (MISSED, {}, MISSED),  # missed under the old timing: stays due, for the misfire policy
        (NOW + timedelta(minutes=1), {}, RECOMPUTED),  # nothing missed: the new timing
        (None, {}, RECOMPUTED),  # finished one-off or ended window
        (MISSED, {"start_at": NOW - timedelta(minutes=5)}, RECOMPUTED),  # before the new start
        (MISSED, {"end_at": NOW - timedelta(minutes=9)}, RECOMPUTED),  # after the new end
    ],
)
def test_retiming_keeps_only_a_missed_fire_time_the_new_window_allows(
    current: datetime | None, window: dict[str, datetime], expected: datetime
) -> None:
    """Retiming keeps only a missed fire time the new window allows. Finding 6 of issue 15."""
    definition = define(
        "job", "t", cron="*/5 * * * *", start_at=window.get("start_at"), end_at=window.get("end_at")
    )
    assert next_fire_after_retiming(current, RECOMPUTED, definition, NOW) == expected


def test_retiming_never_delays_an_earlier_new_fire_time() -> None:
    """Retiming never delays an earlier new fire time. Finding 6 of issue 15."""
    earlier = MISSED - timedelta(minutes=1)  # e.g. a one-off moved into the past
    definition = define("job", "t", at=earlier, allow_past=True)
    assert next_fire_after_retiming(MISSED, earlier, definition, NOW) == earlier
