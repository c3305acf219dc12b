"""What a claim plans for a due schedule: on-time fire times and misfire policies."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from beat.claim.policies import last_fire_at_or_before, plan_fires
from beat.models import DueSchedule, MisfirePolicy
from beat.schedule.timing import Trigger, every, once, parse_cron

UTCZ = ZoneInfo("UTC")
T0 = datetime(2026, 1, 5, 12, 0, tzinfo=UTC)


def due(
    trigger: Trigger, first: datetime, policy: MisfirePolicy = MisfirePolicy.FIRE_ONCE
) -> DueSchedule:
    return DueSchedule(
        id=1,
        name="s",
        task="t",
        trigger=trigger,
        zone=UTCZ,
        args=[],
        kwargs={},
        options={},
        misfire_policy=policy,
        max_attempts=3,
        next_fire_at=first,
    )


def test_on_time_fire_times_all_run_and_next_is_after_now() -> None:
    plan = plan_fires(
        due(every(1, anchor=T0), T0 + timedelta(seconds=1)),
        T0 + timedelta(seconds=5.5),
        misfire_grace=60,
        max_catchup=100,
    )
    assert plan.fire == tuple(T0 + timedelta(seconds=s) for s in range(1, 6))
    assert plan.skipped == ()
    assert plan.next_fire_at == T0 + timedelta(seconds=6)


def test_claiming_ahead_plans_fire_times_up_to_until_and_judges_misfires_by_now() -> None:
    now = T0 + timedelta(seconds=90.5)
    schedule = due(every(1, anchor=T0), T0 + timedelta(seconds=1))  # 89 s overdue at first
    ahead = plan_fires(
        schedule, now, until=now + timedelta(seconds=2), misfire_grace=60, max_catchup=100
    )
    plain = plan_fires(schedule, now, misfire_grace=60, max_catchup=100)

    assert ahead.skipped == plain.skipped, "the grace counts from now, not from until"
    assert ahead.fire == (*plain.fire, now + timedelta(seconds=0.5), now + timedelta(seconds=1.5))
    assert ahead.next_fire_at == now + timedelta(seconds=2.5)


def test_a_past_one_off_fires_once_then_finishes() -> None:
    at = T0 - timedelta(days=2)
    for policy in (MisfirePolicy.FIRE_ONCE, MisfirePolicy.FIRE_ALL):
        plan = plan_fires(due(once(at), at, policy), T0, misfire_grace=60, max_catchup=100)
        assert plan.fire == (at,)
        assert plan.next_fire_at is None


def test_fire_once_coalesces_misfires_into_the_most_recent_and_records_the_rest() -> None:
    # Every minute, down for 10 minutes; grace 60 s: 9 misfires (-10..-2 min) and one on time.
    trigger = every(60, anchor=T0)
    now = T0 + timedelta(minutes=10, seconds=30)
    plan = plan_fires(
        due(trigger, T0 + timedelta(minutes=1)), now, misfire_grace=60, max_catchup=100
    )
    assert plan.fire == (T0 + timedelta(minutes=9), T0 + timedelta(minutes=10))
    assert [s.fire_at for s in plan.skipped] == [T0 + timedelta(minutes=m) for m in range(1, 9)]
    assert all("fire_once" in s.reason for s in plan.skipped)
    assert plan.next_fire_at == T0 + timedelta(minutes=11)


def test_fire_all_runs_every_misfire_up_to_the_bound_and_skips_the_rest() -> None:
    trigger = every(60, anchor=T0)
    now = T0 + timedelta(minutes=10, seconds=30)
    plan = plan_fires(
        due(trigger, T0 + timedelta(minutes=1), MisfirePolicy.FIRE_ALL),
        now,
        misfire_grace=60,
        max_catchup=5,
    )
    assert plan.fire[:5] == tuple(T0 + timedelta(minutes=m) for m in range(1, 6))
    assert plan.fire[5:] == (T0 + timedelta(minutes=10),)
    assert [s.fire_at for s in plan.skipped] == [T0 + timedelta(minutes=m) for m in range(6, 10)]


def test_skip_runs_no_misfire() -> None:
    trigger = every(60, anchor=T0)
    now = T0 + timedelta(minutes=3, seconds=30)
    plan = plan_fires(
        due(trigger, T0 + timedelta(minutes=1), MisfirePolicy.SKIP),
        now,
        misfire_grace=60,
        max_catchup=100,
    )
    assert plan.fire == (T0 + timedelta(minutes=3),)
    assert [s.fire_at for s in plan.skipped] == [
        T0 + timedelta(minutes=1),
        T0 + timedelta(minutes=2),
    ]


def test_a_long_outage_is_summarised_not_enumerated() -> None:
    trigger = every(1, anchor=T0)
    now = T0 + timedelta(days=3)
    plan = plan_fires(
        due(trigger, T0 + timedelta(seconds=1), MisfirePolicy.SKIP),
        now,
        misfire_grace=60,
        max_catchup=10,
    )
    assert len(plan.skipped) == 10
    summary = plan.skipped[-1]
    assert summary.fire_at == now - timedelta(seconds=60)
    missed = 3 * 86400 - 60
    assert f"stands for {missed - 9} fire times" in summary.reason
    assert len(plan.fire) == 10, "on-time fire times are bounded by max_catchup too"


def test_cron_misfire_finds_the_most_recent_missed_time_without_enumerating() -> None:
    trigger = parse_cron("0 3 * * *")
    first = datetime(2025, 1, 1, 3, tzinfo=UTC)
    plan = plan_fires(
        due(trigger, first), datetime(2026, 1, 5, 12, tzinfo=UTC), misfire_grace=60, max_catchup=3
    )
    assert plan.fire == (datetime(2026, 1, 5, 3, tzinfo=UTC),)
    assert "stands for" in plan.skipped[-1].reason
    assert plan.next_fire_at == datetime(2026, 1, 6, 3, tzinfo=UTC)


@settings(max_examples=100, deadline=None)
@given(
    period=st.integers(min_value=1, max_value=7200),
    periods_missed=st.integers(min_value=0, max_value=5000),
    extra=st.floats(min_value=0, max_value=0.999),
)
def test_last_fire_at_or_before_matches_arithmetic(
    period: int, periods_missed: int, extra: float
) -> None:
    trigger = every(period, anchor=T0)
    bound = T0 + timedelta(seconds=period * (periods_missed + extra))
    assert last_fire_at_or_before(trigger, UTCZ, T0, bound) == T0 + timedelta(
        seconds=period * periods_missed
    )


@pytest.mark.parametrize("policy", list(MisfirePolicy))
@settings(max_examples=60, deadline=None)
@given(
    down_for=st.integers(min_value=0, max_value=20_000),
    grace=st.integers(min_value=1, max_value=600),
)
def test_every_missed_fire_time_is_run_or_recorded(
    policy: MisfirePolicy, down_for: int, grace: int
) -> None:
    """No fire time is lost silently: runs and skip records cover all of them."""
    trigger = every(10, anchor=T0)
    now = T0 + timedelta(seconds=10 + down_for)
    plan = plan_fires(
        due(trigger, T0 + timedelta(seconds=10), policy),
        now,
        misfire_grace=grace,
        max_catchup=10_000,
    )
    covered = sorted([*plan.fire, *(s.fire_at for s in plan.skipped)])
    expected = [T0 + timedelta(seconds=10 * k) for k in range(1, (10 + down_for) // 10 + 1)]
    assert covered == expected
    assert plan.next_fire_at == expected[-1] + timedelta(seconds=10)
