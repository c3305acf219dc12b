"""The buckets of a run-statistics window (``beat.store.stats.bucket_starts``) are of
equal length in elapsed time, whatever the zone of the database's ``now``: a window
over a daylight-saving change is not an hour longer or shorter."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

from beat.store.stats import MIN_BUCKET, bucket_starts

#: The day after New York's clocks went back (2026-11-01) and after they went forward
#: (2026-03-08).
AFTER_A_CHANGE = [
    datetime(2026, 11, 2, 12, 0, tzinfo=ZoneInfo("America/New_York")),
    datetime(2026, 3, 9, 12, 0, tzinfo=ZoneInfo("America/New_York")),
]


@pytest.mark.parametrize("now", AFTER_A_CHANGE)
def test_a_window_over_a_clock_change_is_as_long_as_it_says(now: datetime) -> None:
    width, starts = bucket_starts(now, timedelta(days=7), 7)
    assert width == timedelta(days=1)
    elapsed = [b.timestamp() - a.timestamp() for a, b in itertools.pairwise(starts)]
    assert elapsed == [86_400.0] * 6
    assert now.timestamp() - starts[0].timestamp() == 7 * 86_400


def test_buckets_are_never_narrower_than_a_minute() -> None:
    now = datetime(2026, 12, 7, 12, 0, 30, tzinfo=UTC)
    width, starts = bucket_starts(now, timedelta(minutes=10), 60)
    assert (width, len(starts)) == (MIN_BUCKET, 10)
