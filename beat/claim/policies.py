"""What a claim does with a due schedule: which fire times run, which are skipped.

Pure functions of (schedule, database time, settings): no I/O, unit-tested alone.

A fire time is *on time* while it is at most ``misfire_grace`` seconds old when
claimed; every on-time fire time gets its own run, so a leader failover of a
few seconds loses nothing. Older fire times are *misfires* (no leader ran for a
while) and follow the schedule's misfire policy:

- ``fire_once``: they collapse into one run, at the most recent of them;
- ``fire_all``: each gets a run, oldest first, up to ``max_catchup``; the rest are skipped;
- ``skip``: none runs.

Every misfire that does not run is recorded as a ``skipped`` run, so history
shows what was missed and why; past ``max_catchup`` records, one summary record
at the most recent skipped fire time stands for the rest and says how many.

Then the schedule's window (``end_at``, ``max_runs``: a schedule past it is
disabled, with the reason) and its overlap policy, given the runs of the
schedule still waiting or running when claimed:

- ``allow``: every fire time runs;
- ``skip``: nothing runs while a previous run is active; else only the latest;
- ``queue_one``: nothing runs while a previous run is waiting; else only the latest;
- ``cancel_previous``: the latest runs and the active ones are cancelled.

Fire times that lose to a newer one in the same claim are recorded as skipped.
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Sequence
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

from beat.limits import MAX_JITTER_SECONDS
from beat.models import DueSchedule, FirePlan, MisfirePolicy, OverlapPolicy, SkipKind, SkippedFire
from beat.schedule.timing import Every, Trigger, fire_times, next_fire_after

#: Resolution of the search for the last fire time before an instant (fire times are >= 1 s apart).
_SEARCH_RESOLUTION = timedelta(milliseconds=1)
#: Most misfires counted one by one for a summary; past this the count is a lower bound.
MISFIRE_COUNT_CAP = 10_000


def plan_fires(
    due: DueSchedule,
    now: datetime,
    *,
    misfire_grace: float,
    max_catchup: int,
    until: datetime | None = None,
) -> FirePlan:
    """Plan one claim of ``due`` at database time ``now``: its fire times up to ``until``
    (default ``now``; later when claiming ahead), with ``due.next_fire_at <= until``.
    Misfires are judged against ``now``. Raises ValueError for a schedule that cannot
    be planned (a jitter out of range, written around the API's checks)."""
    check_jitter(due.jitter_seconds)
    horizon = now if until is None else max(now, until)
    plan = _plan_misfires(due, now, horizon, misfire_grace=misfire_grace, max_catchup=max_catchup)
    return _apply_overlap(due, _apply_window(due, plan))


def plan_key(due: DueSchedule) -> tuple[object, ...]:
    """Everything of ``due`` that :func:`plan_fires` reads: two schedules with equal
    keys get equal plans at the same claim (a burst's schedules, one cron and one fire
    time, are planned once). Not the schedule's identity or payload; ``runs_count``
    only where ``max_runs`` makes it count."""
    return (
        due.trigger,
        due.zone,
        # Instants, in UTC: times of one zone that differ only in ``fold`` compare equal.
        due.next_fire_at.astimezone(UTC),
        due.misfire_policy,
        due.jitter_seconds,
        None if due.end_at is None else due.end_at.astimezone(UTC),
        due.max_runs,
        due.runs_count if due.max_runs is not None else None,
        due.overlap_policy,
        due.waiting,
        due.running,
    )


def check_jitter(seconds: float) -> None:
    """Raise ValueError unless ``seconds`` is a jitter from 0 to a day (NaN is not)."""
    if not 0.0 <= seconds <= MAX_JITTER_SECONDS:
        raise ValueError(
            f"jitter_seconds is {seconds:g}: it must be from 0 to {MAX_JITTER_SECONDS:g} (a day)"
        )


def jitter_delay(run_id: uuid.UUID, max_seconds: float) -> timedelta:
    """A delay in [0, max_seconds) that depends only on the run ID: a re-claim keeps it."""
    if max_seconds <= 0:
        return timedelta(0)
    fraction = (run_id.int % 1_000_003) / 1_000_003
    return timedelta(seconds=fraction * max_seconds)


def _apply_window(due: DueSchedule, plan: FirePlan) -> FirePlan:
    fire, next_fire_at, reason = list(plan.fire), plan.next_fire_at, None
    if due.end_at is not None:
        fire = [t for t in fire if t <= due.end_at]
        if next_fire_at is not None and next_fire_at > due.end_at:
            next_fire_at, reason = None, f"its window ended at {due.end_at.isoformat()}"
    if due.max_runs is not None:
        remaining = max(due.max_runs - due.runs_count, 0)
        if len(fire) >= remaining and (next_fire_at is not None or len(fire) > remaining):
            fire = fire[:remaining]
            next_fire_at, reason = None, f"it reached its max_runs of {due.max_runs}"
    if reason is None and fire == list(plan.fire):
        return plan
    return replace(plan, fire=tuple(fire), next_fire_at=next_fire_at, disable_reason=reason)


def _apply_overlap(due: DueSchedule, plan: FirePlan) -> FirePlan:
    policy = due.overlap_policy
    if policy is OverlapPolicy.ALLOW or not plan.fire:
        return plan
    latest, earlier = plan.fire[-1], plan.fire[:-1]
    superseded = tuple(
        SkippedFire(
            fire_at=t, reason="overlap: a newer fire time in the same claim", kind=SkipKind.OVERLAP
        )
        for t in earlier
    )
    blocked_by = {
        OverlapPolicy.SKIP: due.waiting + due.running,
        OverlapPolicy.QUEUE_ONE: due.waiting,
    }.get(policy, 0)
    if blocked_by:
        reason = f"overlap ({policy.value}): the previous run is still active"
        skipped = tuple(
            SkippedFire(fire_at=t, reason=reason, kind=SkipKind.OVERLAP) for t in plan.fire
        )
        return replace(plan, fire=(), skipped=_merged(plan.skipped, skipped))
    cancel = policy is OverlapPolicy.CANCEL_PREVIOUS and due.waiting + due.running > 0
    return replace(
        plan, fire=(latest,), skipped=_merged(plan.skipped, superseded), cancel_active=cancel
    )


def _merged(
    first: tuple[SkippedFire, ...], second: tuple[SkippedFire, ...]
) -> tuple[SkippedFire, ...]:
    return tuple(sorted((*first, *second), key=lambda skip: skip.fire_at))


def _plan_misfires(
    due: DueSchedule, now: datetime, horizon: datetime, *, misfire_grace: float, max_catchup: int
) -> FirePlan:
    cutoff = now - timedelta(seconds=misfire_grace)
    first = due.next_fire_at
    if first > cutoff:
        fire = _fire_times_from(due, first, until=horizon, limit=max_catchup)
        return FirePlan(fire=fire, skipped=(), next_fire_at=_next_after(due, fire[-1]))

    last_misfire = last_fire_at_or_before(due.trigger, due.zone, first, cutoff)
    run_misfires, skipped = _apply_misfire_policy(due, first, last_misfire, max_catchup)
    on_time = tuple(
        fire_times(due.trigger, due.zone, after=cutoff, until=horizon, limit=max_catchup)
    )
    last = on_time[-1] if on_time else last_misfire
    return FirePlan(
        fire=run_misfires + on_time, skipped=skipped, next_fire_at=_next_after(due, last)
    )


def _apply_misfire_policy(
    due: DueSchedule, first: datetime, last: datetime, max_catchup: int
) -> tuple[tuple[datetime, ...], tuple[SkippedFire, ...]]:
    """Split the misfires ``first`` .. ``last`` into (runs, skip records) by the policy."""
    policy = due.misfire_policy
    if policy is MisfirePolicy.FIRE_ONCE:
        if first == last:
            return (first,), ()
        before_last = last_fire_at_or_before(
            due.trigger, due.zone, first, last - timedelta(microseconds=1)
        )
        skipped = _skip_records(
            due, first, before_last, max_catchup, "misfire: coalesced into one run by fire_once"
        )
        return (last,), skipped
    if policy is MisfirePolicy.FIRE_ALL:
        fire = _fire_times_from(due, first, until=last, limit=max_catchup)
        if fire[-1] == last:
            return fire, ()
        rest_first = next_fire_after(due.trigger, due.zone, fire[-1])
        assert rest_first is not None  # `last` is a later fire time
        reason = f"misfire: beyond the fire_all catch-up bound of {max_catchup}"
        return fire, _skip_records(due, rest_first, last, max_catchup, reason)
    return (), _skip_records(due, first, last, max_catchup, "misfire: skip policy")


def _skip_records(
    due: DueSchedule, first: datetime, last: datetime, max_catchup: int, reason: str
) -> tuple[SkippedFire, ...]:
    """Records for the fire times ``first`` .. ``last``: one each, or a summary past the bound."""
    times = _fire_times_from(due, first, until=last, limit=max_catchup)
    if times[-1] == last:
        return tuple(SkippedFire(fire_at=t, reason=reason) for t in times)
    shown = times[: max_catchup - 1]
    summarised_from = times[len(shown)]
    count = _count_fire_times(due, summarised_from, last)
    summary = SkippedFire(
        fire_at=last,
        reason=f"{reason}; this record stands for {count} fire times"
        f" from {summarised_from.isoformat()} to {last.isoformat()}",
    )
    return (*(SkippedFire(fire_at=t, reason=reason) for t in shown), summary)


def _count_fire_times(due: DueSchedule, first: datetime, last: datetime) -> str:
    """How many fire times lie in ``first`` .. ``last`` (both fire times), as text."""
    if isinstance(due.trigger, Every):
        periods = (last - first) / timedelta(seconds=due.trigger.seconds)
        return str(math.floor(periods + 1e-9) + 1)
    times = _fire_times_from(due, first, until=last, limit=MISFIRE_COUNT_CAP)
    return str(len(times)) if times[-1] == last else f"more than {MISFIRE_COUNT_CAP}"


def _fire_times_from(
    due: DueSchedule, first: datetime, *, until: datetime, limit: int
) -> tuple[datetime, ...]:
    """``first`` (itself a fire time) and the ones after it up to ``until``: at most ``limit``."""
    later: Sequence[datetime] = ()
    if limit > 1:
        later = fire_times(due.trigger, due.zone, after=first, until=until, limit=limit - 1)
    return (first, *later)


def last_fire_at_or_before(
    trigger: Trigger, zone: ZoneInfo, first: datetime, bound: datetime
) -> datetime:
    """The most recent fire time <= ``bound``, given that ``first`` (<= bound) is one.

    A binary search over ``next_fire_after``, which is monotonic: about forty
    calls whatever the distance, so a long outage costs no more than a short one.
    """
    low, high = (
        first,
        bound,
    )  # invariant: low is a fire time <= bound; none lies in (low, ...] past high
    following = next_fire_after(trigger, zone, low)
    while following is not None and following <= bound and high - low > _SEARCH_RESOLUTION:
        middle = low + (high - low) / 2
        candidate = next_fire_after(trigger, zone, middle)
        if candidate is not None and candidate <= bound:
            low = candidate
            following = next_fire_after(trigger, zone, low)
        else:
            high = middle
    return low


def _next_after(due: DueSchedule, last: datetime) -> datetime | None:
    return next_fire_after(due.trigger, due.zone, last)
