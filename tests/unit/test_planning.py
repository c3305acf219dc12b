"""The decisions of a claim (``beat.planning``): pure, no server."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

from hypothesis import given
from hypothesis import strategies as st

from beat.models import DueSchedule, FirePlan, MisfirePolicy, OverlapPolicy, RunToPublish, SkipKind
from beat.planning import PlanningRules, Release, plan_claim, release_of
from beat.timing import every

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
