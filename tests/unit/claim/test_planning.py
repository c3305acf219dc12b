"""The decisions of a claim (``beat.claim.planning``): pure, no server."""

from __future__ import annotations

import uuid
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from beat.claim import planning
from beat.claim.planning import PlanningRules, Release, plan_claim, release_of
from beat.claim.policies import plan_fires, plan_key
from beat.models import DueSchedule, FirePlan, MisfirePolicy, OverlapPolicy, RunToPublish, SkipKind
from beat.schedule.timing import Trigger, every, parse_cron

NOW = datetime(2026, 12, 3, 12, 0, tzinfo=UTC)
RULES = PlanningRules(misfire_grace=60, max_catchup=100)


def due(
    schedule_id: int = 1,
    *,
    seconds_ago: float = 0.5,
    every_seconds: float = 1,
    overlap: OverlapPolicy = OverlapPolicy.ALLOW,
    jitter: float = 0.0,
    running: int = 0,
    misfire: MisfirePolicy = MisfirePolicy.FIRE_ONCE,
) -> DueSchedule:
    first = NOW - timedelta(seconds=seconds_ago)
    return DueSchedule(
        id=schedule_id,
        name=f"s{schedule_id}",
        task="tasks.demo.record",
        trigger=every(every_seconds, anchor=first),
        zone=ZoneInfo("UTC"),
        args=[],
        kwargs={},
        options={},
        misfire_policy=misfire,
        max_attempts=3,
        next_fire_at=first,
        overlap_policy=overlap,
        jitter_seconds=jitter,
        running=running,
    )


def run(fire_at: datetime | None, not_before: datetime | None) -> RunToPublish:
    return RunToPublish(
        id=uuid.uuid4(),
        task="t",
        args=[],
        kwargs={},
        options={},
        schedule_name="s",
        fire_at=fire_at,
        attempt=0,
        not_before=not_before,
    )


def test_a_due_run_is_released_now_an_ahead_one_armed_a_jittered_one_deferred() -> None:
    later = NOW + timedelta(seconds=2)
    assert release_of(run(NOW, None), NOW) is Release.NOW
    assert release_of(run(later, later), NOW) is Release.ARMED
    assert release_of(run(NOW, NOW + timedelta(seconds=5)), NOW) is Release.DEFERRED
    # Once its time has come, an armed or a jittered run goes now (from the outbox).
    assert release_of(run(later, later), later) is Release.NOW
    assert release_of(run(NOW, later), later) is Release.NOW


@given(
    fire=st.floats(min_value=-100, max_value=100),
    delay=st.one_of(st.none(), st.floats(min_value=-100, max_value=100)),
)
def test_no_run_is_released_now_before_its_not_before(fire: float, delay: float | None) -> None:
    fire_at = NOW + timedelta(seconds=fire)
    not_before = None if delay is None else fire_at + timedelta(seconds=delay)
    release = release_of(run(fire_at, not_before), NOW)
    assert (release is Release.NOW) == (not_before is None or not_before <= NOW)
    if release is Release.ARMED:
        assert not_before == fire_at > NOW


def test_claiming_ahead_arms_allow_schedules_only() -> None:
    horizon = NOW + timedelta(seconds=3)
    plan = plan_claim(
        [due(1), due(2, overlap=OverlapPolicy.SKIP)], NOW, horizon, RULES.plan_schedule
    )
    by_schedule: dict[int, list[Release]] = {}
    for new in plan.new_runs:
        by_schedule.setdefault(new.schedule.id, []).append(release_of(new.to_publish(), NOW))
    assert by_schedule[1] == [Release.NOW, Release.ARMED, Release.ARMED, Release.ARMED]
    assert by_schedule[2] == [Release.NOW], "other overlap policies wait for their fire time"


def test_a_jittered_run_waits_in_the_outbox_within_its_jitter() -> None:
    plan = plan_claim([due(jitter=30)], NOW, NOW, RULES.plan_schedule)
    [new] = plan.new_runs
    assert new.not_before is not None
    assert new.fire_at <= new.not_before < new.fire_at + timedelta(seconds=30)


def test_skips_are_counted_by_kind_as_values() -> None:
    misfired = due(1, seconds_ago=600, every_seconds=60)  # 10 missed: fire_once keeps one
    blocked = due(2, overlap=OverlapPolicy.SKIP, running=1)
    plan = plan_claim([misfired, blocked], NOW, NOW, RULES.plan_schedule)
    assert plan.skip_counts == {SkipKind.MISFIRE: 9, SkipKind.OVERLAP: 1}


def test_a_schedule_whose_planning_raises_is_quarantined_alone() -> None:
    def planner(schedule: DueSchedule, now: datetime, until: datetime) -> FirePlan:
        if schedule.id == 2:
            raise ValueError("bad zone")
        return RULES.plan_schedule(schedule, now, until)

    plan = plan_claim([due(1), due(2), due(3)], NOW, NOW, planner)
    assert [q.schedule_id for q in plan.quarantined] == [2]
    assert "bad zone" in plan.quarantined[0].reason
    assert [advance.schedule_id for advance in plan.advances] == [1, 3]


def test_cancel_previous_cancels_the_active_runs_of_its_schedule_only() -> None:
    plan = plan_claim(
        [due(1, overlap=OverlapPolicy.CANCEL_PREVIOUS, running=1), due(2, running=1)],
        NOW,
        NOW,
        RULES.plan_schedule,
    )
    assert plan.cancel_active_of == [1]


def test_advance_moves_each_schedule_past_what_it_handled() -> None:
    plan = plan_claim([due(seconds_ago=2.5)], NOW, NOW, RULES.plan_schedule)
    [advance] = plan.advances
    assert advance.fired == 3
    assert advance.last_fire_at == max(new.fire_at for new in plan.new_runs)
    assert advance.next_fire_at is not None
    assert advance.next_fire_at > NOW


# -- planning in bulk: one plan per key, checked against planning each schedule alone ----

ZONES = [ZoneInfo("UTC"), ZoneInfo("Europe/Paris"), ZoneInfo("America/New_York")]
TRIGGERS: list[Trigger] = [
    parse_cron("0 0 * * *"),
    parse_cron("*/5 * * * *"),
    every(300, anchor=NOW),
    every(7, anchor=NOW - timedelta(seconds=3)),
]


@st.composite
def due_schedules(draw: st.DrawFn, schedule_id: int) -> DueSchedule:
    """A due schedule drawn from a small space, so that a batch repeats keys."""
    zone = draw(st.sampled_from(ZONES))
    trigger = draw(st.sampled_from(TRIGGERS))
    max_runs = draw(st.sampled_from([None, 1, 3]))
    return DueSchedule(
        id=schedule_id,
        name=f"s{schedule_id}",
        task=draw(st.sampled_from(["a.task", "b.task"])),
        trigger=trigger,
        zone=zone,
        args=[schedule_id],
        kwargs={},
        options=draw(st.sampled_from([{}, {"queue": "q"}])),
        misfire_policy=draw(st.sampled_from(list(MisfirePolicy))),
        max_attempts=draw(st.integers(1, 3)),
        next_fire_at=NOW - timedelta(minutes=draw(st.sampled_from([0, 1, 10, 600]))),
        overlap_policy=draw(st.sampled_from(list(OverlapPolicy))),
        end_at=draw(st.sampled_from([None, NOW + timedelta(minutes=5), NOW - timedelta(hours=1)])),
        max_runs=max_runs,
        runs_count=draw(st.integers(0, 4)),
        waiting=draw(st.integers(0, 1)),
        running=draw(st.integers(0, 1)),
    )


#: Fields a batch's schedules may differ in, one at a time, with values to take.
VARIANTS: dict[str, list[Any]] = {
    "trigger": [parse_cron("0 0 * * *"), every(7, anchor=NOW - timedelta(seconds=3))],
    "zone": ZONES,
    "next_fire_at": [NOW - timedelta(minutes=10), NOW],
    "misfire_policy": list(MisfirePolicy),
    "jitter_seconds": [0.0, 30.0, 100_000.0],  # the last cannot be planned
    "end_at": [None, NOW + timedelta(minutes=5), NOW - timedelta(hours=1)],
    "max_runs": [None, 1, 3],
    "runs_count": [0, 2, 4],
    "overlap_policy": list(OverlapPolicy),
    "waiting": [0, 1],
    "running": [0, 1],
}


@st.composite
def claims(draw: st.DrawFn) -> tuple[datetime, list[DueSchedule]]:
    """A batch of schedules alike but for their identity, each differing from the
    first in at most one field: keys collide often, and nearly."""
    now = NOW + timedelta(seconds=draw(st.sampled_from([0, 1, 3600])))
    base = draw(due_schedules(1))
    batch = [base]
    for schedule_id in range(2, draw(st.integers(2, 12)) + 1):
        schedule = replace(base, id=schedule_id, name=f"s{schedule_id}", args=[schedule_id])
        changed = draw(st.sampled_from([None, *VARIANTS]))
        if changed is not None:
            schedule = replace(schedule, **{changed: draw(st.sampled_from(VARIANTS[changed]))})
        batch.append(schedule)
    return now, batch


def alone(schedule: DueSchedule, now: datetime, until: datetime) -> FirePlan:
    return plan_fires(schedule, now, until=until, misfire_grace=60, max_catchup=100)


@settings(max_examples=400, deadline=None)
@given(st.lists(claims(), min_size=1, max_size=3), st.sampled_from([0.0, 5.0, 600.0]))
def test_planning_in_bulk_gives_each_schedule_the_plan_it_gets_alone(
    batches: list[tuple[datetime, list[DueSchedule]]], ahead: float
) -> None:
    rules = PlanningRules(misfire_grace=60, max_catchup=100)  # one memo across claims
    for now, batch in batches:
        horizon = now + timedelta(seconds=ahead)
        planned = plan_claim(batch, now, horizon, rules.plan_schedule)
        oracle = plan_claim(batch, now, horizon, alone)
        assert planned.plans == oracle.plans
        assert planned.quarantined == oracle.quarantined
        assert [(r.schedule.id, r.fire_at) for r in planned.new_runs] == [
            (r.schedule.id, r.fire_at) for r in oracle.new_runs
        ]


@given(due_schedules(1), due_schedules(2))
def test_schedules_with_one_key_plan_alike(first: DueSchedule, second: DueSchedule) -> None:
    """What ``plan_key`` leaves out (identity, payload, a count no bound reads) does
    not change a plan: the key holds all that planning reads."""
    twin = replace(
        second,
        **{
            name: getattr(first, name)
            for name in (
                "trigger",
                "zone",
                "next_fire_at",
                "misfire_policy",
                "jitter_seconds",
                "end_at",
                "max_runs",
                "overlap_policy",
                "waiting",
                "running",
            )
        },
    )
    if first.max_runs is not None:
        twin = replace(twin, runs_count=first.runs_count)
    assert plan_key(twin) == plan_key(first)
    for until in (NOW, NOW + timedelta(minutes=10)):
        assert alone(twin, NOW, until) == alone(first, NOW, until)


def test_a_burst_is_planned_once(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = 0

    def counting(*args: Any, **kwargs: Any) -> FirePlan:
        nonlocal calls
        calls += 1
        return plan_fires(*args, **kwargs)

    burst = [due(schedule_id, seconds_ago=1) for schedule_id in range(1, 1001)]
    burst = [replace(s, trigger=burst[0].trigger) for s in burst]
    monkeypatch.setattr(planning, "plan_fires", counting)
    rules = PlanningRules(misfire_grace=60, max_catchup=100)
    plan = plan_claim(burst, NOW, NOW, rules.plan_schedule)
    assert calls == 1
    assert len(plan.new_runs) == len(plan_claim(burst, NOW, NOW, alone).new_runs) == 2000


def test_schedules_an_hour_apart_in_the_repeated_hour_are_planned_apart() -> None:
    """Two fire times of one zone that differ only in ``fold`` compare equal in Python;
    sharing a plan between them would give one schedule the other's fire times."""
    berlin = ZoneInfo("Europe/Berlin")
    earlier = datetime(2026, 10, 25, 0, 30, tzinfo=UTC).astimezone(berlin)
    later = datetime(2026, 10, 25, 1, 30, tzinfo=UTC).astimezone(berlin)
    first = replace(due(1), trigger=parse_cron("30 * * * *"), next_fire_at=earlier)
    second = replace(first, id=2, name="s2", next_fire_at=later)
    now = datetime(2026, 10, 25, 1, 30, 5, tzinfo=UTC)
    rules = PlanningRules(misfire_grace=60, max_catchup=100)
    planned = plan_claim([first, second], now, now, rules.plan_schedule)
    assert planned.plans == plan_claim([first, second], now, now, alone).plans
