"""The failing monitor's rule (``beat.monitors.failing``), for every history: checked
against an oracle that replays a schedule's outcomes one at a time, as they would have
been seen had the leader looked after each."""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta

from hypothesis import given
from hypothesis import strategies as st

from beat.monitors.failing import Decision, OpenIncident, Outcome, Thresholds, decide

START = datetime(2026, 12, 6, tzinfo=UTC)


def outcomes_of(failed: list[bool]) -> list[Outcome]:
    """Outcomes in the order they happened, returned newest first (as read)."""
    history = [
        Outcome(fire_at=START + timedelta(minutes=index), failed=value, error=f"e{index}")
        for index, value in enumerate(failed)
    ]
    return history[::-1]


@dataclass
class Replayed:
    """What the oracle expects after each outcome in turn."""

    open: bool = False
    paused: bool = False
    #: Failures since the schedule was last paused by the monitor (or since the streak
    #: began), and in the current streak.
    since_pause: int = 0
    streak: int = 0
    opened: int = 0
    resolved: int = 0
    pauses: int = 0


def replay(failed: list[bool], thresholds: Thresholds, *, resumed_after_pause: bool) -> Replayed:
    """The oracle: one outcome at a time, with the rules in words. An incident opens at
    the lower threshold set; a success resolves it; a pause comes after pause_after
    failures since the last pause; an operator resumes at once if asked to."""
    state = Replayed()
    opens_at = min(
        [count for count in (thresholds.alert_after, thresholds.pause_after) if count], default=0
    )
    for value in failed:
        if not value:
            if state.open:
                state.resolved += 1
            state.open, state.streak, state.since_pause = False, 0, 0
            continue
        state.streak += 1
        state.since_pause += 1
        if opens_at and not state.open and state.streak >= opens_at:
            state.open, state.opened = True, state.opened + 1
        if (
            state.open
            and thresholds.pause_after
            and not state.paused
            and state.since_pause >= thresholds.pause_after
        ):
            state.paused, state.pauses, state.since_pause = True, state.pauses + 1, 0
            if resumed_after_pause:
                state.paused = False
    return state


def monitor(failed: list[bool], thresholds: Thresholds, *, resumed_after_pause: bool) -> Replayed:
    """The rule under test, looked at after each outcome, its decisions applied as the
    store applies them."""
    state = Replayed()
    incident: OpenIncident | None = None
    enabled = True
    for seen in range(1, len(failed) + 1):
        decision = decide(
            outcomes_of(failed[:seen]), thresholds, enabled=enabled, incident=incident
        )
        if decision.resolve:
            incident, state.resolved = None, state.resolved + 1
            continue
        if decision.open:
            incident, state.opened = (
                OpenIncident(id=1, failures=0, paused_after_fire_at=None),
                state.opened + 1,
            )
        if decision.failures is not None:
            assert incident is not None
            incident = replace(incident, failures=decision.failures)
        if decision.pause_after_fire_at is not None:
            assert incident is not None
            state.pauses += 1
            incident = replace(incident, paused_after_fire_at=decision.pause_after_fire_at)
            enabled = resumed_after_pause
    state.open = incident is not None
    return state


histories = st.lists(st.booleans(), max_size=30)
thresholds = st.builds(Thresholds, alert_after=st.integers(0, 6), pause_after=st.integers(0, 6))


@given(failed=histories, limits=thresholds, resumed=st.booleans())
def test_incidents_and_pauses_follow_the_outcomes_one_at_a_time(
    failed: list[bool], limits: Thresholds, resumed: bool
) -> None:
    expected = replay(failed, limits, resumed_after_pause=resumed)
    found = monitor(failed, limits, resumed_after_pause=resumed)
    assert (found.open, found.opened, found.resolved, found.pauses) == (
        expected.open,
        expected.opened,
        expected.resolved,
        expected.pauses,
    )


@given(failed=histories, limits=thresholds)
def test_a_pass_that_missed_some_outcomes_decides_as_one_that_saw_them_all(
    failed: list[bool], limits: Thresholds
) -> None:
    """The leader looks every few seconds, not after each run: with no incident yet,
    looking once at the whole history opens one exactly when the oracle has one open."""
    expected = replay(failed, limits, resumed_after_pause=False)
    decision = decide(outcomes_of(failed), limits, enabled=True, incident=None)
    assert decision.open == expected.open


def test_three_failures_in_a_row_open_an_incident_with_the_streak_s_first_and_last() -> None:
    decision = decide(
        outcomes_of([False, True, True, True]), Thresholds(alert_after=3, pause_after=0),
        enabled=True, incident=None,
    )  # fmt: skip
    assert decision == Decision(
        open=True,
        failures=3,
        first_failure_at=START + timedelta(minutes=1),
        last_error="e3",
    )


def test_a_success_resolves_the_open_incident() -> None:
    incident = OpenIncident(id=7, failures=3, paused_after_fire_at=None)
    decision = decide(
        outcomes_of([True, True, True, False]), Thresholds(alert_after=3, pause_after=0),
        enabled=True, incident=incident,
    )  # fmt: skip
    assert decision.resolve == "the run due 2026-12-06 00:03:00 UTC succeeded"


def test_a_paused_schedule_is_not_paused_again() -> None:
    decision = decide(
        outcomes_of([True] * 5), Thresholds(alert_after=0, pause_after=2),
        enabled=False, incident=None,
    )  # fmt: skip
    assert decision.open
    assert decision.pause_after_fire_at is None


def test_a_resumed_schedule_pauses_again_after_as_many_new_failures() -> None:
    paused_at = START + timedelta(minutes=1)
    incident = OpenIncident(id=1, failures=2, paused_after_fire_at=paused_at)
    limits = Thresholds(alert_after=0, pause_after=2)
    one_more = decide(outcomes_of([True] * 3), limits, enabled=True, incident=incident)
    two_more = decide(outcomes_of([True] * 4), limits, enabled=True, incident=incident)
    assert one_more.pause_after_fire_at is None
    assert two_more.pause_after_fire_at == START + timedelta(minutes=3)


def test_a_monitor_turned_off_resolves_its_open_incident_and_opens_none() -> None:
    off = Thresholds(alert_after=0, pause_after=0)
    incident = OpenIncident(id=1, failures=3, paused_after_fire_at=None)
    assert decide(outcomes_of([True] * 9), off, enabled=True, incident=incident).resolve
    assert decide(outcomes_of([True] * 9), off, enabled=True, incident=None) == Decision()
