"""The run monitors: a schedule's ``max_runtime``, ``late_after`` and ``missed_after``,
judged on the facts the leader reads of its runs (``beat.store.leader.run_monitors``),
every time by the database's clock.

- **overran**: a run still ``running`` ``max_runtime`` after it started. Judged on the
  runs running now: any past it, the incident is open; none, it resolves.
- **late**: a run that started more than ``late_after`` after its fire time. Judged on
  the schedule's newest fire time whose start is known or overdue: started (or ended
  without starting) late, or still waiting past ``late_after``, the incident is open;
  started in time, it resolves. A run Celery retried is passed over (its start is the
  retry's).
- **missed**: a fire time not sent within ``missed_after`` of it. Judged on the
  schedule's newest fire time at least ``missed_after`` old: not claimed yet, claimed
  that late, skipped by its misfire policy (no leader claimed it in time), or still
  waiting in the outbox unsent, the incident is open; else it resolves. A paused
  schedule misses nothing: its incident resolves.

A verdict is a :class:`Finding` (open the incident, or update the open one), a
:class:`Cleared` (resolve the open one) or None (nothing known: nothing changes).
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from beat.models import RunState

#: Skip records of the misfire policy start so (``beat.claim.policies``); those of the
#: overlap policy (the user's choice) start with "overlap".
MISFIRE_REASON_PREFIX = "misfire"


@dataclass(frozen=True, kw_only=True, slots=True)
class Finding:
    """Something is wrong: ``count`` runs (or fire times), the oldest due at
    ``first_fire_at``, told in one line."""

    count: int
    first_fire_at: datetime | None
    text: str


@dataclass(frozen=True, kw_only=True, slots=True)
class Cleared:
    """Nothing is wrong any more, for this reason."""

    resolution: str


Verdict = Finding | Cleared | None


@dataclass(frozen=True, kw_only=True, slots=True)
class Overrun:
    """A run still running past its schedule's ``max_runtime``."""

    run_id: uuid.UUID
    fire_at: datetime | None
    #: Seconds since it started, by the database's clock.
    running_for: float


@dataclass(frozen=True, kw_only=True, slots=True)
class StartFacts:
    """What the late monitor reads of a schedule's newest judged run."""

    fire_at: datetime
    state: str
    started_at: datetime | None
    finished_at: datetime | None


@dataclass(frozen=True, kw_only=True, slots=True)
class FireFacts:
    """What the missed monitor reads of a schedule's newest fire time at least
    ``missed_after`` old: a run's row, or none (``claimed_at`` None: not claimed)."""

    fire_at: datetime
    claimed_at: datetime | None = None
    state: str | None = None
    reason: str | None = None
    #: Published at least once (a run the reaper put back in the outbox was sent).
    sent: bool = False


def overran(overruns: Sequence[Overrun], max_runtime: float, *, revoked: bool) -> Verdict:
    """The overran verdict on the runs of one schedule running past ``max_runtime``."""
    if not overruns:
        return Cleared(resolution="no run of it is past its max_runtime any more")
    longest = max(overruns, key=lambda overrun: overrun.running_for)
    text = (
        f"run {longest.run_id} has been running for {span_text(longest.running_for)},"
        f" past its max_runtime of {span_text(max_runtime)}"
    )
    if len(overruns) > 1:
        text += f" ({len(overruns)} runs are past it)"
    if revoked:
        text += "; revoked: it ends failed"
    fire_times = [overrun.fire_at for overrun in overruns if overrun.fire_at is not None]
    return Finding(count=len(overruns), first_fire_at=min(fire_times, default=None), text=text)


def late(newest: StartFacts | None, late_after: float, *, now: datetime) -> Verdict:
    """The late verdict on a schedule's newest judged run (None: none yet)."""
    if newest is None:
        return None
    due = _moment_text(newest.fire_at)
    if newest.started_at is not None:
        delay = (newest.started_at - newest.fire_at).total_seconds()
        told = f"the run due {due} started {span_text(delay)} after its fire time"
    elif newest.state in _WAITING:
        delay = (now - newest.fire_at).total_seconds()
        told = f"the run due {due} has not started {span_text(delay)} after its fire time"
    else:
        delay = ((newest.finished_at or now) - newest.fire_at).total_seconds()
        told = f"the run due {due} never started: it ended {newest.state}"
    if delay <= late_after:
        return Cleared(resolution=told)
    return Finding(
        count=1,
        first_fire_at=newest.fire_at,
        text=f"{told} (late after {span_text(late_after)})",
    )


def missed(newest: FireFacts | None, missed_after: float, *, enabled: bool) -> Verdict:
    """The missed verdict on a schedule's newest fire time at least ``missed_after`` old
    (None: none)."""
    if not enabled:
        return Cleared(resolution="its schedule is paused")
    if newest is None:
        return None
    due = _moment_text(newest.fire_at)
    why = _miss(newest, missed_after)
    if why is None:
        return Cleared(resolution=f"the fire time {due} was sent in time")
    return Finding(
        count=1,
        first_fire_at=newest.fire_at,
        text=f"the fire time {due} {why} (missed after {span_text(missed_after)})",
    )


def _miss(fire: FireFacts, missed_after: float) -> str | None:
    """How the fire time was missed, or None if it was not."""
    if fire.claimed_at is None:
        return "was not claimed: no leader claims, or the leader cannot"
    if fire.state == RunState.SKIPPED.value and (fire.reason or "").startswith(
        MISFIRE_REASON_PREFIX
    ):
        return "was skipped by its misfire policy: no leader claimed it in time"
    claim_delay = (fire.claimed_at - fire.fire_at).total_seconds()
    if claim_delay > missed_after:
        return f"was claimed {span_text(claim_delay)} after it"
    if not fire.sent and fire.state in (RunState.PENDING.value, RunState.EXPIRED.value):
        return "was not sent: its run waits in the outbox" + (
            "" if fire.state == RunState.PENDING.value else ", and expired there"
        )
    return None


_WAITING = frozenset({RunState.PENDING.value, RunState.QUEUED.value, RunState.RETRYING.value})


def span_text(seconds: float) -> str:
    """``seconds`` for people: 45s, 6m 10s, 2h 5m, 3d 4h."""
    whole = max(0, round(seconds))
    days, rest = divmod(whole, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    parts = [(days, "d"), (hours, "h"), (minutes, "m"), (secs, "s")]
    shown = [f"{value}{unit}" for value, unit in parts if value]
    return " ".join(shown[:2]) or "0s"


def _moment_text(moment: datetime) -> str:
    return f"{moment.astimezone(UTC):%Y-%m-%d %H:%M:%S} UTC"
