"""The failing monitor: a schedule whose newest runs failed so many times in a row has
an incident, and may pause itself; its first success resolves the incident.

What counts is a schedule's runs with a fire time that finished, newest fire time first:
``failed``, ``lost`` and ``expired`` are failures, ``succeeded`` ends a streak;
``skipped`` and ``cancelled`` (a policy's or an operator's decision) are passed over.

The thresholds: ``alert_after`` failures in a row open the incident; ``pause_after``
pause the schedule (and open the incident, if ``alert_after`` did not already). 0 is
never. An operator who resumes a schedule paused this way gives it ``pause_after``
failures again before it pauses again: the failures counted for a pause are those after
the one that paused it last.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime


@dataclass(frozen=True, kw_only=True, slots=True)
class Outcome:
    """One finished run that counts, as the monitor reads it."""

    fire_at: datetime
    failed: bool
    #: Why it failed, for people (None for a success, or none recorded).
    error: str | None = None


@dataclass(frozen=True, kw_only=True, slots=True)
class OpenIncident:
    """What the monitor needs of a schedule's open failing incident."""

    id: int
    failures: int
    #: The fire time of the failure that paused the schedule last (None: never paused).
    paused_after_fire_at: datetime | None


@dataclass(frozen=True, kw_only=True, slots=True)
class Thresholds:
    alert_after: int
    pause_after: int

    @property
    def opens_after(self) -> int:
        """Failures in a row that open an incident: the lower threshold set; 0, never."""
        return min((count for count in (self.alert_after, self.pause_after) if count), default=0)


@dataclass(frozen=True, kw_only=True, slots=True)
class Decision:
    """What to write for one schedule; all False/None: nothing."""

    #: Open an incident: the failures in a row (as far as read), the first one's fire
    #: time and the newest one's error.
    open: bool = False
    #: The failures in a row, to record on the open (or opened) incident; None: none.
    failures: int | None = None
    first_failure_at: datetime | None = None
    last_error: str | None = None
    #: Pause the schedule after the failure of this fire time.
    pause_after_fire_at: datetime | None = None
    #: Resolve the open incident, for this reason.
    resolve: str | None = None


def streak(outcomes: Sequence[Outcome]) -> list[Outcome]:
    """The newest failures in a row (newest first), up to the first success."""
    failures: list[Outcome] = []
    for outcome in outcomes:
        if not outcome.failed:
            break
        failures.append(outcome)
    return failures


def decide(
    outcomes: Sequence[Outcome],
    thresholds: Thresholds,
    *,
    enabled: bool,
    incident: OpenIncident | None,
) -> Decision:
    """What the failing monitor does for a schedule, given its newest counted outcomes
    (newest fire time first: as many as the larger threshold, or more), its thresholds,
    whether it is enabled, and its open failing incident."""
    if thresholds.opens_after == 0:
        return Decision(resolve="its failing monitor was turned off") if incident else Decision()
    if not outcomes:
        return Decision()
    failures = streak(outcomes)
    if not failures:
        if incident is None:
            return Decision()
        fired = outcomes[0].fire_at.astimezone(UTC)
        return Decision(resolve=f"the run due {fired:%Y-%m-%d %H:%M:%S} UTC succeeded")
    opening = incident is None and len(failures) >= thresholds.opens_after
    if incident is None and not opening:
        return Decision()
    newest = failures[0]
    return Decision(
        open=opening,
        failures=len(failures),
        first_failure_at=failures[-1].fire_at,
        last_error=newest.error,
        pause_after_fire_at=(
            newest.fire_at
            if enabled and _pauses(failures, thresholds.pause_after, incident)
            else None
        ),
    )


def _pauses(failures: Sequence[Outcome], pause_after: int, incident: OpenIncident | None) -> bool:
    """Whether the streak pauses the schedule: ``pause_after`` failures since the one that
    paused it last."""
    if pause_after == 0:
        return False
    since = None if incident is None else incident.paused_after_fire_at
    counted = [outcome for outcome in failures if since is None or outcome.fire_at > since]
    return len(counted) >= pause_after
