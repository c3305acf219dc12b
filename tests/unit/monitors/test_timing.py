"""The run monitors' rules (``beat.monitors.timing``): overran, late and missed, each
checked for all inputs against a plain statement of the rule."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

from hypothesis import given
from hypothesis import strategies as st

from beat.models import RunState
from beat.monitors.timing import (
    Cleared,
    Finding,
    FireFacts,
    Overrun,
    StartFacts,
    late,
    missed,
    overran,
    span_text,
)

FIRE = datetime(2026, 12, 6, 12, 0, tzinfo=UTC)
seconds = st.floats(min_value=0, max_value=86400 * 3, allow_nan=False)
limits = st.floats(min_value=1, max_value=86400, allow_nan=False)


def test_no_run_past_max_runtime_clears_the_overran_incident() -> None:
    assert isinstance(overran([], 60.0, revoked=False), Cleared)


@given(st.lists(seconds, min_size=1, max_size=5), limits, st.booleans())
def test_runs_past_max_runtime_are_found_with_the_longest_told(
    running_for: list[float], max_runtime: float, revoked: bool
) -> None:
    overruns = [
        Overrun(run_id=uuid.uuid4(), fire_at=FIRE + timedelta(minutes=i), running_for=value)
        for i, value in enumerate(running_for)
    ]
    verdict = overran(overruns, max_runtime, revoked=revoked)
    assert isinstance(verdict, Finding)
    assert verdict.count == len(overruns)
    assert verdict.first_fire_at == FIRE
    longest = max(overruns, key=lambda overrun: overrun.running_for)
    assert str(longest.run_id) in verdict.text
    assert ("revoked" in verdict.text) is revoked


@given(seconds, limits)
def test_a_run_that_started_is_late_exactly_when_it_started_past_late_after(
    delay: float, late_after: float
) -> None:
    started = StartFacts(
        fire_at=FIRE,
        state=RunState.SUCCEEDED.value,
        started_at=FIRE + timedelta(seconds=delay),
        finished_at=FIRE + timedelta(seconds=delay + 1),
    )
    verdict = late(started, late_after, now=FIRE + timedelta(days=5))
    # Compared as the verdict computes it: through a timedelta (microseconds).
    really = timedelta(seconds=delay).total_seconds()
    assert isinstance(verdict, Finding if really > late_after else Cleared)


@given(seconds, limits, st.sampled_from([RunState.PENDING, RunState.QUEUED, RunState.RETRYING]))
def test_a_waiting_run_is_late_once_it_waits_past_late_after_by_the_database_clock(
    waited: float, late_after: float, state: RunState
) -> None:
    waiting = StartFacts(fire_at=FIRE, state=state.value, started_at=None, finished_at=None)
    verdict = late(waiting, late_after, now=FIRE + timedelta(seconds=waited))
    really = timedelta(seconds=waited).total_seconds()
    assert isinstance(verdict, Finding if really > late_after else Cleared)
    if isinstance(verdict, Finding):
        assert "has not started" in verdict.text


def test_a_run_that_expired_unstarted_past_late_after_is_late() -> None:
    expired = StartFacts(
        fire_at=FIRE,
        state=RunState.EXPIRED.value,
        started_at=None,
        finished_at=FIRE + timedelta(minutes=10),
    )
    verdict = late(expired, 60, now=FIRE + timedelta(hours=1))
    assert isinstance(verdict, Finding)
    assert "never started: it ended expired" in verdict.text


def test_no_judged_run_changes_nothing() -> None:
    assert late(None, 60, now=FIRE) is None
    assert missed(None, 60, enabled=True) is None


def test_a_paused_schedule_misses_nothing() -> None:
    unclaimed = FireFacts(fire_at=FIRE)
    assert isinstance(missed(unclaimed, 60, enabled=False), Cleared)


fire_facts = st.builds(
    FireFacts,
    fire_at=st.just(FIRE),
    claimed_at=st.none() | seconds.map(lambda s: FIRE + timedelta(seconds=s - 3600)),
    state=st.sampled_from([state.value for state in RunState]),
    reason=st.sampled_from([None, "misfire: skip policy", "overlap (skip): still active"]),
    sent=st.booleans(),
)


@given(fire_facts, limits)
def test_a_fire_time_is_missed_exactly_when_it_was_not_claimed_or_sent_in_time(
    fire: FireFacts, missed_after: float
) -> None:
    not_claimed = fire.claimed_at is None
    skipped_by_misfire = fire.state == "skipped" and (fire.reason or "").startswith("misfire")
    claimed_late = (
        fire.claimed_at is not None
        and (fire.claimed_at - fire.fire_at).total_seconds() > missed_after
    )
    unsent = not fire.sent and fire.state in ("pending", "expired")
    expected = not_claimed or skipped_by_misfire or claimed_late or unsent
    verdict = missed(fire, missed_after, enabled=True)
    assert isinstance(verdict, Finding if expected else Cleared)


@given(seconds)
def test_a_span_is_told_in_at_most_two_units(value: float) -> None:
    told = span_text(value)
    assert 1 <= len(told.split()) <= 2
    assert told[-1] in "dhms"


def test_spans_read_as_people_say_them() -> None:
    assert span_text(0.2) == "0s"
    assert span_text(45) == "45s"
    assert span_text(370) == "6m 10s"
    assert span_text(7500) == "2h 5m"
    assert span_text(3 * 86400 + 4 * 3600 + 59) == "3d 4h"
