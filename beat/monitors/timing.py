"""The run monitors: a schedule's ``max_runtime``, ``late_after`` and ``missed_after``,
judged on the facts the leader reads of its runs (``beat.store.leader.run_monitors``),
every time by the database's clock.

- **overran**: a run still ``running`` ``max_runtime`` after it started. Judged on the
  runs running now: any past it, the incident is open; none, it resolves.
- **late**: a run whose first start came more than ``late_after`` after it was due
  (its fire time, or the end of its jitter). Judged on the schedule's newest run due
  by now: started late, still waiting past ``late_after``, or ended without ever
  starting, the incident is open; started in time, it resolves.
- **missed**: a fire time not sent within ``missed_after`` of it (of the end of its
  jitter). Judged on the schedule's newest fire time at least ``missed_after`` old: not
  claimed yet, skipped by its misfire policy (no leader claimed it in time), first sent
  that late, or still unsent, the incident is open; sent in time, it resolves.

A run's first send and first start count, whatever came after (a reaper's send again,
a retry). The newest run is judged, or nothing is: a run an operator made (trigger,
backfill), one cancelled, one the overlap policy skipped, or one whose verdict is not
known yet leaves the incident as it is, rather than judge an older run again. A paused
schedule is neither late nor missed: its incidents resolve.

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
class RunFacts:
    """What the late and missed monitors read of a schedule's newest run."""

    fire_at: datetime
    #: When it was due to go: its fire time, or later if its jitter held it back.
    due_at: datetime
    state: str
    reason: str | None = None
    by_operator: bool = False
    #: Its first send and its first start (None: not yet).
    sent_at: datetime | None = None
    started_at: datetime | None = None
    finished_at: datetime | None = None

    @property
    def passed_over(self) -> bool:
        """An operator's run, a cancelled one, one the overlap policy skipped: not a fire
        time the schedule's timing ran (or missed)."""
        if self.by_operator or self.state == RunState.CANCELLED.value:
            return True
        return self.state == RunState.SKIPPED.value and not self.skipped_by_misfire

    @property
    def skipped_by_misfire(self) -> bool:
        return self.state == RunState.SKIPPED.value and (self.reason or "").startswith(
            MISFIRE_REASON_PREFIX
        )

    @property
    def waiting(self) -> bool:
        """Not started yet, and may still start (a plain run is ``running`` from its
        receipt, before its body starts)."""
        return self.started_at is None and self.state in _NOT_ENDED


def overran(
    overruns: Sequence[Overrun], max_runtime: float, *, revoked: bool, of_schedule: int
) -> Verdict:
    """The overran verdict on the runs of one schedule running past ``max_runtime``
    (``of_schedule`` of them in all; those read, the longest first, may be fewer)."""
    if not overruns:
        return Cleared(resolution="no run of it is past its max_runtime any more")
    longest = max(overruns, key=lambda overrun: overrun.running_for)
    text = (
        f"run {longest.run_id} has been running for {span_text(longest.running_for)},"
        f" past its max_runtime of {span_text(max_runtime)}"
    )
    count = max(of_schedule, len(overruns))
    if count > 1:
        text += f" ({count} runs are past it)"
    if revoked:
        text += "; revoked: it ends failed"
    fire_times = [overrun.fire_at for overrun in overruns if overrun.fire_at is not None]
    return Finding(count=count, first_fire_at=min(fire_times, default=None), text=text)


def late(
    newest: RunFacts | None, late_after: float, *, now: datetime, enabled: bool = True
) -> Verdict:
    """The late verdict on a schedule's newest run due by now (None: none yet)."""
    if not enabled:
        return Cleared(resolution="its schedule is paused")
    if newest is None or newest.passed_over or newest.skipped_by_misfire:
        return None
    due = _moment_text(newest.fire_at)
    if newest.started_at is not None:
        delay = (newest.started_at - newest.due_at).total_seconds()
        told = f"the run due {due} started {span_text(delay)} after it was due"
        if delay <= late_after:
            return Cleared(resolution=told)
    elif newest.waiting:
        delay = (now - newest.due_at).total_seconds()
        if delay <= late_after:
            return None  # not known yet
        told = f"the run due {due} has not started {span_text(delay)} after it was due"
    else:
        told = f"the run due {due} never started: it ended {newest.state}"
    return Finding(
        count=1,
        first_fire_at=newest.fire_at,
        text=f"{told} (late after {span_text(late_after)})",
    )


def missed(
    newest: RunFacts | None,
    missed_after: float,
    *,
    now: datetime,
    enabled: bool,
    unclaimed_since: datetime | None = None,
) -> Verdict:
    """The missed verdict on a schedule's newest fire time at least ``missed_after``
    old: its run (``newest``), or, ``unclaimed_since``, a fire time no run was claimed
    for yet. ``enabled`` False with a fire time to come is a pause; a schedule disabled
    because its window ended has its last fire time judged still."""
    if not enabled:
        return Cleared(resolution="its schedule is paused")
    if unclaimed_since is not None:
        return _missed(
            unclaimed_since,
            "was not claimed: no leader claims, or the leader cannot",
            missed_after,
        )
    if newest is None or newest.passed_over:
        return None
    if newest.skipped_by_misfire:
        return _missed(
            newest.fire_at,
            "was skipped by its misfire policy: no leader claimed it in time",
            missed_after,
        )
    due = _moment_text(newest.fire_at)
    if newest.sent_at is not None:
        delay = (newest.sent_at - newest.due_at).total_seconds()
        if delay <= missed_after:
            return Cleared(resolution=f"the fire time {due} was sent in time")
        return _missed(newest.fire_at, f"was sent {span_text(delay)} after it", missed_after)
    if newest.state in _NOT_ENDED:
        if (now - newest.due_at).total_seconds() <= missed_after:
            return None  # held back by its jitter, or not known yet
        return _missed(newest.fire_at, "was not sent: its run waits in the outbox", missed_after)
    return _missed(newest.fire_at, f"was never sent: its run ended {newest.state}", missed_after)


def _missed(fire_at: datetime, why: str, missed_after: float) -> Finding:
    limit = span_text(missed_after)
    told = f"the fire time {_moment_text(fire_at)} {why} (missed after {limit})"
    return Finding(count=1, first_fire_at=fire_at, text=told)


#: States of a run that has not ended (a plain run is ``running`` from its receipt).
_NOT_ENDED = frozenset(
    {
        RunState.PENDING.value,
        RunState.QUEUED.value,
        RunState.RETRYING.value,
        RunState.RUNNING.value,
    }
)


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
