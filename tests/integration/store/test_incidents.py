"""The failing monitor's pass against real PostgreSQL (``beat.store.leader.monitors``):
incidents opened once, updated, resolved by a success, schedules paused with their
reason and their runs claimed ahead cancelled, every write fenced by the epoch."""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import insert, select, update

from beat.errors import StaleEpoch
from beat.models import IncidentKind, RunState
from beat.ops.schedules import Schedules
from beat.store.all_roles import Store
from beat.store.leader.monitors import MARGIN
from beat.store.tables import incidents, monitor_progress, runs
from tests.integration.helpers import finished_runs

pytestmark = pytest.mark.integration

TASK = "tasks.demo.add"


def watch(store: Store, epoch: int = 1, *, alert: int = 3, pause: int = 0) -> Any:
    return store.watch_failures(epoch, alert_after=alert, pause_after=pause, idle_timeout=5)


def rows(store: Store) -> list[Any]:
    with store.engine.connect() as conn:
        return list(conn.execute(select(incidents).order_by(incidents.c.id)))


@pytest.fixture
def schedules(store: Store) -> Schedules:
    assert store.take_leadership(1, "leader")
    return Schedules(store)


def test_three_failures_in_a_row_open_one_incident_and_a_success_resolves_it(
    store: Store, schedules: Schedules
) -> None:
    schedules.create("nightly", TASK, every=60, allow_unregistered=True)
    finished_runs(store, "nightly", [RunState.SUCCEEDED, RunState.FAILED, RunState.LOST])
    assert watch(store).opened == []

    finished_runs(store, "nightly", [RunState.EXPIRED])
    report = watch(store)
    again = watch(store)

    assert report.opened == [("nightly", 3)]
    assert again.opened == []
    assert again.open == {kind: 0 for kind in IncidentKind} | {IncidentKind.FAILING: 1}
    [incident] = schedules.incidents()
    assert (incident.schedule_name, incident.failures, incident.open) == ("nightly", 3, True)
    assert incident.last_error == "ValueError: boom"

    finished_runs(store, "nightly", [RunState.SUCCEEDED])
    resolved = watch(store)

    assert [name for name, _ in resolved.resolved] == ["nightly"]
    assert schedules.incidents() == []
    [closed] = schedules.incidents(include_resolved=True)
    assert closed.resolution is not None
    assert closed.resolution.endswith("succeeded")


def test_skipped_and_cancelled_runs_neither_break_nor_extend_a_streak(
    store: Store, schedules: Schedules
) -> None:
    schedules.create("skips", TASK, every=60, allow_unregistered=True)
    finished_runs(
        store,
        "skips",
        [RunState.FAILED, RunState.SKIPPED, RunState.FAILED, RunState.CANCELLED, RunState.FAILED],
    )
    assert watch(store).opened == [("skips", 3)]


def test_a_schedule_s_own_thresholds_override_the_cluster_s(
    store: Store, schedules: Schedules
) -> None:
    schedules.create("quiet", TASK, every=60, allow_unregistered=True, alert_after_failures=0)
    schedules.create("touchy", TASK, every=60, allow_unregistered=True, alert_after_failures=1)
    finished_runs(store, "quiet", [RunState.FAILED] * 5)
    finished_runs(store, "touchy", [RunState.FAILED])

    assert watch(store).opened == [("touchy", 1)]


def test_a_schedule_failing_past_its_pause_threshold_is_paused_with_the_reason(
    store: Store, schedules: Schedules
) -> None:
    schedules.create("flaky", TASK, every=60, allow_unregistered=True, pause_after_failures=2)
    finished_runs(store, "flaky", [RunState.FAILED] * 2, error="KeyError: 'rates'")

    report = watch(store)

    assert report.opened == [("flaky", 2)]
    assert report.paused == [("flaky", 2)]
    paused = schedules.get("flaky")
    assert not paused.definition.enabled
    [incident] = schedules.incidents()
    assert paused.disabled_reason == (
        f"paused by the scheduler after 2 failures in a row (incident {incident.id});"
        " the last: KeyError: 'rates'"
    )
    assert incident.paused_at is not None

    schedules.resume("flaky")
    finished_runs(store, "flaky", [RunState.FAILED])
    assert watch(store).paused == []
    assert schedules.get("flaky").definition.enabled
    finished_runs(store, "flaky", [RunState.FAILED])
    assert watch(store).paused == [("flaky", 4)]
    assert not schedules.get("flaky").definition.enabled


def test_a_pause_cancels_the_runs_claimed_ahead_of_their_time(
    store: Store, schedules: Schedules
) -> None:
    schedules.create("ahead", TASK, every=60, allow_unregistered=True, pause_after_failures=1)
    schedule = store.get_schedule("ahead")
    ahead = uuid.uuid4()
    later = store.now() + timedelta(minutes=5)
    with store.engine.begin() as conn:
        conn.execute(
            insert(runs).values(
                id=ahead,
                schedule_id=schedule.id,
                schedule_name="ahead",
                task=TASK,
                state=RunState.PENDING.value,
                fire_at=later,
                not_before=later,
            )
        )
    finished_runs(store, "ahead", [RunState.FAILED])

    watch(store)

    with store.engine.connect() as conn:
        state = conn.execute(select(runs.c.state).where(runs.c.id == ahead)).scalar_one()
    assert state == RunState.CANCELLED.value


def test_a_deposed_leader_writes_nothing(store: Store, schedules: Schedules) -> None:
    schedules.create("fenced", TASK, every=60, allow_unregistered=True, pause_after_failures=1)
    finished_runs(store, "fenced", [RunState.FAILED] * 3)
    assert store.take_leadership(2, "newer")

    with pytest.raises(StaleEpoch):
        watch(store, epoch=1)

    assert rows(store) == []
    assert schedules.get("fenced").definition.enabled


def test_the_incident_of_a_removed_schedule_is_resolved(store: Store, schedules: Schedules) -> None:
    schedules.create("doomed", TASK, every=60, allow_unregistered=True)
    finished_runs(store, "doomed", [RunState.FAILED] * 3)
    watch(store)

    schedules.delete("doomed")
    report = watch(store)

    assert report.resolved == [("doomed", "its schedule was removed")]
    assert report.open == {kind: 0 for kind in IncidentKind}


def test_runs_finished_long_before_the_last_pass_are_not_looked_at_again(
    store: Store, schedules: Schedules
) -> None:
    """Each pass looks at the runs finished since the last, less a margin for late
    commits: an old failure is not counted anew by every pass."""
    schedules.create("old", TASK, every=60, allow_unregistered=True)
    watch(store)
    finished_runs(store, "old", [RunState.FAILED] * 3, ago=MARGIN + timedelta(minutes=1))
    assert watch(store).looked_at == 0

    with store.engine.begin() as conn:
        conn.execute(
            update(monitor_progress).values(checked_until=store.now() - timedelta(hours=1))
        )
    assert watch(store).opened == [("old", 3)]


def test_a_run_finished_within_the_margin_before_the_last_pass_is_still_counted(
    store: Store, schedules: Schedules
) -> None:
    """A worker's transaction stamps its run's end with its start and commits later: a
    run that appears after a pass, stamped before it, is counted by the next."""
    schedules.create("late-commit", TASK, every=60, allow_unregistered=True)
    watch(store)
    finished_runs(store, "late-commit", [RunState.FAILED] * 3, ago=MARGIN / 2)

    assert watch(store).opened == [("late-commit", 3)]


def test_a_pass_looks_at_a_bounded_number_of_schedules_and_the_next_at_others(
    store: Store, schedules: Schedules, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Many schedules failing at once: each pass (one transaction of the leader's loop)
    takes a bounded number, at random; those left out fail again and are taken later."""
    monkeypatch.setattr("beat.store.leader.monitors.BATCH", 2)
    names = [f"outage-{index}" for index in range(5)]
    for name in names:
        schedules.create(name, TASK, every=60, allow_unregistered=True, alert_after_failures=1)
        finished_runs(store, name, [RunState.FAILED])

    opened: list[str] = []
    for _ in range(30):
        report = watch(store)
        assert len(report.opened) <= 2
        opened += [name for name, _ in report.opened]
        for name in set(names) - set(opened):
            finished_runs(store, name, [RunState.FAILED])  # their next runs fail too
        if len(opened) == len(names):
            break

    assert sorted(opened) == names


def test_a_schedule_made_again_under_a_removed_one_s_name_starts_without_its_failures(
    store: Store, schedules: Schedules
) -> None:
    """Runs are a schedule's by its ID: the history a removed schedule left under the same
    name (a code schedule removed and added back, an import) is not counted."""
    schedules.create("reborn", TASK, every=60, allow_unregistered=True, pause_after_failures=3)
    finished_runs(store, "reborn", [RunState.FAILED] * 2)
    schedules.delete("reborn")
    schedules.create("reborn", TASK, every=60, allow_unregistered=True, pause_after_failures=3)
    finished_runs(store, "reborn", [RunState.FAILED])

    report = watch(store)

    assert report.opened == []
    assert report.paused == []
    assert schedules.get("reborn").definition.enabled


def test_an_incident_keeps_the_first_500_characters_of_a_long_error(
    store: Store, schedules: Schedules
) -> None:
    schedules.create("verbose", TASK, every=60, allow_unregistered=True)
    finished_runs(store, "verbose", [RunState.FAILED] * 3, error="Traceback: " + "x" * 1_000_000)

    watch(store)

    [incident] = schedules.incidents()
    assert incident.last_error == ("Traceback: " + "x" * 1_000_000)[:500]


def test_a_schedule_counts_only_the_failure_states_it_names_and_passes_over_the_others(
    store: Store, schedules: Schedules
) -> None:
    schedules.create("strict", TASK, every=60, allow_unregistered=True, failure_states=["failed"])
    schedules.create("lossy", TASK, every=60, allow_unregistered=True, failure_states=["lost"])
    outcomes = [RunState.FAILED, RunState.LOST, RunState.FAILED, RunState.EXPIRED, RunState.FAILED]
    finished_runs(store, "strict", outcomes)
    finished_runs(store, "lossy", outcomes)

    report = watch(store)

    # strict: failed, (lost), failed, (expired), failed: three in a row; lossy: one lost.
    assert report.opened == [("strict", 3)]
