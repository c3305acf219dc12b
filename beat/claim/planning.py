"""Every decision of a claim, as pure functions: no I/O, no clock but the one given.

A claim transaction reads the due schedules and the database's ``now``, hands
them to :func:`plan_claim`, and writes what the plan says: the stores decide
nothing. What one schedule does at a claim (misfire, window and overlap
policies) is :func:`beat.claim.policies.plan_fires`; this module applies it to a
batch and adds the decisions around it:

- how far each schedule is planned: to the claim-ahead horizon for the
  ``allow`` overlap policy, else to ``now`` (other policies look at the runs
  active when the fire time comes, so they wait for it);
- when each new run may be sent (:func:`release_of`), the one rule behind
  ``not_before``:

  ========================================  =====================  ==========
  run                                       ``not_before``         release
  ========================================  =====================  ==========
  due, no jitter                            None                   ``NOW``
  jittered                                  fire time + its delay  ``DEFERRED``
                                                                   (outbox)
  claimed ahead of its fire time, no jitter  its fire time         ``ARMED``
  ========================================  =====================  ==========

  A deferred or armed run whose time has come is released ``NOW``;
- which schedules are quarantined (their planning raised) and which are
  disabled (their window ended), with the reason;
- what each skipped fire time counts as (:class:`SkipKind`), as a value.
"""

from __future__ import annotations

import enum
import uuid
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from beat.claim.policies import jitter_delay, plan_fires, plan_key
from beat.claim.run_ids import new_run_id
from beat.errors import error_text
from beat.models import DueSchedule, FirePlan, OverlapPolicy, Quarantine, RunToPublish, SkipKind

#: Plans one due schedule's fire times: ``plan(schedule, now, until)``, up to ``until``.
SchedulePlanner = Callable[[DueSchedule, datetime, datetime], FirePlan]


class Release(enum.Enum):
    """When a claimed run is sent."""

    #: Now, by the claiming leader.
    NOW = "now"
    #: At its fire time, by the leader that claimed it ahead (from memory); by any
    #: other leader from the outbox once the time has come.
    ARMED = "armed"
    #: At its ``not_before`` (its jitter), from the outbox.
    DEFERRED = "deferred"


@dataclass(frozen=True, kw_only=True, slots=True)
class PlanningRules:
    """The settings a claim plans with (``habeat_misfire_grace``, ``habeat_max_catchup``).

    A claim's schedules that planning cannot tell apart (``plan_key``: one trigger,
    zone, fire time and policies) are planned once: at midnight, thousands of daily
    crons share one plan, and computing it for each was a sixth of what a leader
    spent on a run. Plans are kept for one claim (one database ``now``) only."""

    misfire_grace: float
    max_catchup: int
    _memo: _ClaimPlans = field(default_factory=lambda: _ClaimPlans(), compare=False, repr=False)

    def plan_schedule(self, due: DueSchedule, now: datetime, until: datetime) -> FirePlan:
        key = (plan_key(due), until.astimezone(UTC))
        plan = self._memo.get(now.astimezone(UTC), key)
        if plan is None:
            # A schedule whose planning raises is not kept: each is quarantined alone.
            plan = plan_fires(
                due,
                now,
                until=until,
                misfire_grace=self.misfire_grace,
                max_catchup=self.max_catchup,
            )
            self._memo.keep(key, plan)
        return plan


class _ClaimPlans:
    """The plans of the latest claim time, by ``(plan_key, until)``."""

    __slots__ = ("now", "plans")

    def __init__(self) -> None:
        self.now: datetime | None = None
        self.plans: dict[tuple[object, ...], FirePlan] = {}

    def get(self, now: datetime, key: tuple[object, ...]) -> FirePlan | None:
        if now != self.now:
            self.now, self.plans = now, {}
        return self.plans.get(key)

    def keep(self, key: tuple[object, ...], plan: FirePlan) -> None:
        self.plans[key] = plan


@dataclass(frozen=True, kw_only=True, slots=True)
class NewRun:
    """A run a claim creates: one fire time of one schedule."""

    id: uuid.UUID
    schedule: DueSchedule
    fire_at: datetime
    not_before: datetime | None

    def to_publish(self) -> RunToPublish:
        schedule = self.schedule
        return RunToPublish(
            id=self.id,
            task=schedule.task,
            args=schedule.args,
            kwargs=schedule.kwargs,
            options=schedule.options,
            schedule_name=schedule.name,
            fire_at=self.fire_at,
            attempt=0,
            not_before=self.not_before,
        )


@dataclass(frozen=True, kw_only=True, slots=True)
class Advance:
    """How a claimed schedule's row changes."""

    schedule_id: int
    next_fire_at: datetime | None
    last_fire_at: datetime
    fired: int
    disable_reason: str | None


@dataclass(frozen=True, kw_only=True, slots=True)
class ClaimPlan:
    """Everything one claim writes, decided before anything is written."""

    #: Each planned schedule with its plan, in claim order.
    plans: list[tuple[DueSchedule, FirePlan]]
    #: The runs to insert, with their release time.
    new_runs: list[NewRun]
    #: Schedules set aside because their planning raised (the rest of the batch goes on).
    quarantined: list[Quarantine]

    @property
    def advances(self) -> list[Advance]:
        return [
            Advance(
                schedule_id=schedule.id,
                next_fire_at=plan.next_fire_at,
                last_fire_at=last_fire(plan, schedule),
                fired=len(plan.fire),
                disable_reason=plan.disable_reason,
            )
            for schedule, plan in self.plans
        ]

    @property
    def cancel_active_of(self) -> list[int]:
        """Schedules whose active runs are cancelled (overlap policy ``cancel_previous``)."""
        return [schedule.id for schedule, plan in self.plans if plan.cancel_active]

    @property
    def disabled(self) -> list[tuple[str, str]]:
        """Schedules whose window ended, with the reason."""
        return [(s.name, p.disable_reason) for s, p in self.plans if p.disable_reason]

    @property
    def skip_counts(self) -> Counter[SkipKind]:
        return Counter(skip.kind for _, plan in self.plans for skip in plan.skipped)


def plan_claim(
    due: Sequence[DueSchedule], now: datetime, horizon: datetime, plan: SchedulePlanner
) -> ClaimPlan:
    """Plan a claim of ``due`` at database time ``now``, claiming ahead to ``horizon``.

    A schedule whose planning raises is quarantined alone (its data is at fault:
    planning is pure computation) and the others go on."""
    plans: list[tuple[DueSchedule, FirePlan]] = []
    new_runs: list[NewRun] = []
    quarantined: list[Quarantine] = []
    for schedule in due:
        try:
            fire_plan = plan(schedule, now, planned_until(schedule, now, horizon))
            runs = [new_run(schedule, fire_at, now) for fire_at in fire_plan.fire]
        except Exception as exc:  # one schedule's bad data must not stop the batch
            reason = f"its fire times cannot be planned: {error_text(exc)}"
            quarantined.append(
                Quarantine(schedule_id=schedule.id, name=schedule.name, reason=reason)
            )
            continue
        plans.append((schedule, fire_plan))
        new_runs.extend(runs)
    return ClaimPlan(plans=plans, new_runs=new_runs, quarantined=quarantined)


def claim_horizon(now: datetime, ahead: float) -> datetime:
    """The latest fire time a claim at ``now`` takes, claiming ``ahead`` seconds ahead."""
    return now + timedelta(seconds=ahead)


def planned_until(schedule: DueSchedule, now: datetime, horizon: datetime) -> datetime:
    """How far to plan a claimed schedule: to the claim-ahead horizon if it may be
    claimed ahead (overlap policy ``allow``), else to now."""
    return horizon if schedule.overlap_policy is OverlapPolicy.ALLOW else now


def new_run(schedule: DueSchedule, fire_at: datetime, now: datetime) -> NewRun:
    run_id = new_run_id()
    return NewRun(
        id=run_id,
        schedule=schedule,
        fire_at=fire_at,
        not_before=not_before(run_id, fire_at, schedule.jitter_seconds, now),
    )


def not_before(
    run_id: uuid.UUID, fire_at: datetime, jitter_seconds: float, now: datetime
) -> datetime | None:
    """When a new run may be sent: after its jitter; at its fire time if it is
    claimed ahead of it; else (None) at once."""
    if jitter_seconds > 0:
        return fire_at + jitter_delay(run_id, jitter_seconds)
    return fire_at if fire_at > now else None


def release_of(run: RunToPublish, now: datetime) -> Release:
    """When ``run``, claimed at database time ``now``, is sent (see the module's table)."""
    if run.not_before is None or run.not_before <= now:
        return Release.NOW
    if run.fire_at is not None and run.not_before == run.fire_at:
        return Release.ARMED
    return Release.DEFERRED


def last_fire(plan: FirePlan, schedule: DueSchedule) -> datetime:
    """The latest fire time a claim handled (run or skipped): the schedule's new
    ``last_fire_at``."""
    times = [*plan.fire, *(skip.fire_at for skip in plan.skipped)]
    return max(times) if times else schedule.next_fire_at
