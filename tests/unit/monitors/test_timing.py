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
    Overrun,
    RunFacts,
    late,
    missed,
    overran,
    span_text,
)

FIRE = datetime(2026, 12, 6, 12, 0, tzinfo=UTC)
seconds = st.floats(min_value=0, max_value=86400 * 3, allow_nan=False)
limits = st.floats(min_value=1, max_value=86400, allow_nan=False)


def test_no_run_past_max_runtime_clears_the_overran_incident() -> None:
    assert isinstance(overran([], 60.0, revoked=False, of_schedule=0), Cleared)


@given(st.lists(seconds, min_size=1, max_size=5), limits, st.booleans(), st.integers(0, 50))
def test_runs_past_max_runtime_are_found_with_the_longest_told(
    running_for: list[float], max_runtime: float, revoked: bool, more: int
) -> None:
    overruns = [
        Overrun(run_id=uuid.uuid4(), fire_at=FIRE + timedelta(minutes=i), running_for=value)
        for i, value in enumerate(running_for)
    ]
    verdict = overran(overruns, max_runtime, revoked=revoked, of_schedule=len(overruns) + more)
    assert isinstance(verdict, Finding)
    assert verdict.count == len(overruns) + more
    assert verdict.first_fire_at == FIRE
    longest = max(overruns, key=lambda overrun: overrun.running_for)
    assert str(longest.run_id) in verdict.text
    assert ("revoked" in verdict.text) is revoked


def started(delay: float, *, jitter: float = 0.0, state: RunState = RunState.SUCCEEDED) -> RunFacts:
    due = FIRE + timedelta(seconds=jitter)
    return RunFacts(
        fire_at=FIRE,
        due_at=due,
        state=state.value,
        sent_at=due,
        started_at=due + timedelta(seconds=delay),
        finished_at=due + timedelta(seconds=delay + 1),
    )


@given(seconds, limits, st.floats(0, 3600))
def test_a_run_is_late_exactly_when_its_first_start_came_past_late_after_its_due_time(
    delay: float, late_after: float, jitter: float
) -> None:
    verdict = late(started(delay, jitter=jitter), late_after, now=FIRE + timedelta(days=5))
    # Compared as the verdict computes it: through a timedelta (microseconds).
    really = timedelta(seconds=delay).total_seconds()
    assert isinstance(verdict, Finding if really > late_after else Cleared)


waiting_states = st.sampled_from(
    [RunState.PENDING, RunState.QUEUED, RunState.RETRYING, RunState.RUNNING]
)


@given(seconds, limits, waiting_states)
def test_a_waiting_run_is_late_once_it_waits_past_late_after_and_unknown_before(
    waited: float, late_after: float, state: RunState
) -> None:
    waiting = RunFacts(fire_at=FIRE, due_at=FIRE, state=state.value)
    verdict = late(waiting, late_after, now=FIRE + timedelta(seconds=waited))
    really = timedelta(seconds=waited).total_seconds()
    if really > late_after:
        assert isinstance(verdict, Finding)
        assert "has not started" in verdict.text
    else:
        assert verdict is None


@given(limits, st.sampled_from([RunState.EXPIRED, RunState.LOST, RunState.FAILED]))
def test_a_run_that_ended_without_ever_starting_is_late_however_soon_it_ended(
    late_after: float, state: RunState
) -> None:
    ended = RunFacts(
        fire_at=FIRE, due_at=FIRE, state=state.value, finished_at=FIRE + timedelta(seconds=1)
    )
    verdict = late(ended, late_after, now=FIRE + timedelta(seconds=2))
    assert isinstance(verdict, Finding)
    assert f"never started: it ended {state.value}" in verdict.text


passed_over = st.sampled_from(
    [
        RunFacts(fire_at=FIRE, due_at=FIRE, state="succeeded", by_operator=True),
        RunFacts(fire_at=FIRE, due_at=FIRE, state="cancelled"),
        RunFacts(fire_at=FIRE, due_at=FIRE, state="skipped", reason="overlap (skip): active"),
    ]
)


@given(passed_over, limits)
def test_a_run_not_of_the_timing_leaves_the_incidents_as_they_are(
    run: RunFacts, limit: float
) -> None:
    now = FIRE + timedelta(days=1)
    assert late(run, limit, now=now) is None
    assert missed(run, limit, now=now, enabled=True) is None


def test_no_judged_run_changes_nothing_and_a_pause_resolves() -> None:
    assert late(None, 60, now=FIRE) is None
    assert missed(None, 60, now=FIRE, enabled=True) is None
    assert isinstance(late(None, 60, now=FIRE, enabled=False), Cleared)
    unclaimed = missed(None, 60, now=FIRE, enabled=False, unclaimed_since=FIRE)
    assert isinstance(unclaimed, Cleared)


fire_facts = st.builds(
    RunFacts,
    fire_at=st.just(FIRE),
    due_at=st.floats(0, 600).map(lambda s: FIRE + timedelta(seconds=s)),
    state=st.sampled_from([state.value for state in RunState]),
    reason=st.sampled_from([None, "misfire: skip policy", "overlap (skip): still active"]),
    by_operator=st.booleans(),
    sent_at=st.none() | seconds.map(lambda s: FIRE + timedelta(seconds=s)),
)


@given(fire_facts, limits, seconds)
def test_a_fire_time_is_missed_exactly_when_it_was_not_sent_in_time(
    fire: RunFacts, missed_after: float, age: float
) -> None:
    now = FIRE + timedelta(seconds=age)
    verdict = missed(fire, missed_after, now=now, enabled=True)
    skipped = fire.state == "skipped"
    by_misfire = skipped and (fire.reason or "").startswith("misfire")
    if fire.by_operator or fire.state == "cancelled" or (skipped and not by_misfire):
        assert verdict is None
        return
    if by_misfire:
        assert isinstance(verdict, Finding)
        return
    if fire.sent_at is not None:
        late_by = (fire.sent_at - fire.due_at).total_seconds()
        assert isinstance(verdict, Finding if late_by > missed_after else Cleared)
        return
    not_ended = fire.state in ("pending", "queued", "retrying", "running")
    waited = (now - fire.due_at).total_seconds()
    if not_ended and waited <= missed_after:
        assert verdict is None
    else:
        assert isinstance(verdict, Finding)


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
